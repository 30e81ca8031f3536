"""The study as a record: opening or resuming the Optuna study and what autotune stores on it
(``study``), and the storage URL's rules (``storage``)."""
