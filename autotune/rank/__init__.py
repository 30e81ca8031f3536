"""What runs inside a DDP rank's process: open the process group and the workload with the
trial's settings (``session``), warm up, time the windows (``run.run_rank``) or the limit probe's
phases (``limit_probe``), and return a ``core.rank_io.RankResult``. Imports only ``core``: a
rank never loads the driver's code (``tests/unit/test_layout.py``)."""
