"""TY-Arranger's scheduling policies (the TAIYI reinforcement-learning job controller): TYJobs, their
job queue policies (Priority, DRF), pod policies (Gang, BinPack, LeaderFirst, MinFragment,
JobAffinity, JobAntiAffinity), schedule states and stages, as one plugin (``tyarranger``,
registered in ``server/plugins/__init__.py``). The formulas are in ``docs/plugins/tyarranger.md``."""
