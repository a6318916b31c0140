"""Checkpoints of ccl.torch objects saved by each format version, and the runs that made them."""
