"""The search, in the driver: the loop that asks Optuna for trials and decides when to stop
(``loop``), one trial's objective (``objective``), the first measurement (``first_look``), the
evidence-ordered screening of priors (``screening``), samplers, the budget and its reserve
(``budget``), the stop rules (``stop``), and after the search the re-validation
(``validation``) and ablation (``ablation``)."""
