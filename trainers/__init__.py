"""Built-in workloads. Each module defines ``workload(**options) -> autotune.Workload``;
its docstring's first line is what ``autotune trainers`` shows."""
