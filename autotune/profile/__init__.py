"""The profile: the YAML document a run exports (``export``) and a user applies
(``profile.Profile``), and the rules of its sections (``rules``)."""
