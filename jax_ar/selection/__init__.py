"""Selection: which kernel serves a call, decided at trace time from
static sizes and a cost table (cost_model.py), the table's file format
(table.py) and the shipped defaults (defaults.py)."""
from .cost_model import (CANDIDATES, COMPOSITIONS, NORM_PATHS, candidates_for, choose_algorithm,
                         choose_composition, choose_for, choose_kernel, choose_norm_path,
                         clear_cache, predict_all, predict_compositions_us, predict_us, table_for)
from .defaults import default_table
from .table import TableError

__all__ = ["CANDIDATES", "COMPOSITIONS", "NORM_PATHS", "TableError", "candidates_for",
           "choose_algorithm", "choose_composition", "choose_for", "choose_kernel",
           "choose_norm_path", "clear_cache", "default_table", "predict_all",
           "predict_compositions_us", "predict_us", "table_for"]
