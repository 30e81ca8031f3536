"""What bounds the step: the limit probe run on a configuration and summarised (``probe``),
and the alpha-beta model of the measured breakdown that says whether a step is compute-,
bandwidth-, latency- or data-bound and what each family of knobs could gain (``evidence``)."""
