"""Running a trial's ranks from the driver: the Ray instance or cluster (``cluster``), the
placement of ranks and the pool of warm processes (``launcher``, ``pool``), one measurement
with its timeout (``measure``), the ranks' results combined (``results``), failures classified
(``failures``) and the hardware description (``hardware``)."""
