"""Selection: which algorithm serves a call, decided at trace time from
static sizes and a cost table (cost_model.py), the table's file format
(table.py) and the shipped defaults (defaults.py)."""
from .cost_model import (CANDIDATES, NORM_PATHS, choose_algorithm, choose_for,
                         choose_norm_path, clear_cache, predict_all, predict_us, table_for)
from .defaults import default_table
from .table import TableError

__all__ = ["CANDIDATES", "NORM_PATHS", "TableError", "choose_algorithm", "choose_for",
           "choose_norm_path", "clear_cache", "default_table", "predict_all", "predict_us",
           "table_for"]
