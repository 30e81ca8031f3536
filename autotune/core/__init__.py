"""The core that both sides import: what a trial's configuration is (the knob catalogue,
``TrialConfig``, values), how it is applied inside a process (``apply``, the allocator pin), the
statistics of a measurement, the errors, the types that cross between the driver and a rank
(``rank_io``), the safe YAML loader and the one place that touches a dependency's private API
(``compat``). It imports nothing else of autotune (``tests/unit/test_layout.py``)."""
