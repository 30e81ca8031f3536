"""The search benchmark's simulator: the tuner's whole loop replayed against a recorded
landscape of measurements (``simulate``), and its tables (``table``)."""
