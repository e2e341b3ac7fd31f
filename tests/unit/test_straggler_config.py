"""The straggler options' config: partial groups fit a group, and the synchronous
trainer, whose every step waits for all its episodes, refuses both options."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.data.loader import RowLoader
from agentrl.trainer.batches import SyncBatches
from agentrl.trainer.ledger import RunLedger


def test_a_partial_group_larger_than_a_group_names_both_keys():
    with pytest.raises(ConfigError, match=r"trainer.min_group_size \(5\).*rollout.n \(4\)"):
        load_config(None, ["rollout.n=4", "trainer.min_group_size=5"])


@pytest.mark.parametrize("option", ["trainer.oversample_groups=2", "trainer.min_group_size=2"])
def test_the_synchronous_trainer_refuses_the_straggler_options(option):
    cfg = load_config(None, ["rollout.n=4", option])
    ledger = RunLedger(Path("unused"), RowLoader([{"n": 0}], 1))
    with pytest.raises(ValueError, match=r"without --sync, with trainer\.max_staleness=0"):
        SyncBatches(cfg, None, ledger, None)
