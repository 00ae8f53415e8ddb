"""Muster's own plugins, with no Volcano or KAI equivalent: ``gang-backend`` (a gang's tasks all go to
nodes of one backend, since backends bind independently). The scheduler adds it as a last tier of
every configuration (``server/scheduler.py``) unless ``session.gangAcrossBackends`` is set; it is
registered in ``server/plugins/__init__.py``. Its page is ``docs/plugins/gang-backend.md``.
``reservation`` (Slurm-style reservations for big gangs, with the ``reserve`` action; off unless
configured): ``docs/plugins/reservation.md``."""
