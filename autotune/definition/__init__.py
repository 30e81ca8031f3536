"""What the user asked for: the run's settings declared once (``settings``), the study
definition file (``studydef``), the search space file resolved against the machine (``space``),
durations and the run directory's paths."""
