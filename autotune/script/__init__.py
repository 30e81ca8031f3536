"""Script mode: a trial is the user's own command under ``torchrun``, watched by a guard
process (``guard``, run as ``python -m autotune.script.guard``), its step reports read back
(``report``) and turned into a measurement (``trial``); ``job`` describes the command."""
