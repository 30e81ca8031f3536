"""What the user sees: the typed events the tuning loop emits (``events``), the live
progress display that renders them (``progress``), and the report with its figures
(``report``, ``figures``)."""
