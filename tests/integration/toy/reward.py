"""Toy reward for training tests: the fraction of response characters that are vowels."""


def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str.strip()
    return sum(c in "aeiouAEIOU" for c in text) / max(len(text), 1)
