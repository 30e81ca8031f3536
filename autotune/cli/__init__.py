"""The ``autotune`` command: ``main`` (``run`` and the error and exit-code rules), ``study``
(commands that read a stored study) and ``tools`` (profiles, the network lab, listings)."""
