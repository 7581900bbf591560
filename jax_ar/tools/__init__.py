"""The command-line tools (bench, tune, launch) and what they share: sweeps
over ranks, timing, data, plots. The library never imports this package."""
