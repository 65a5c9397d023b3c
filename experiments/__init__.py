"""Experiments: one script per figure or table; ``python -m experiments`` regenerates them all (see __main__)."""
