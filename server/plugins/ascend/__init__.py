"""Huawei Ascend's plugin: ``huaweiNPU``, Ascend 910 chip affinity (the two HCCS rings of a 910 x8
node), under the name Ascend's own Volcano plugin registers and following Ascend's "NPU affinity
scheduling" rules; registered in ``server/plugins/__init__.py``. The rules, in English, are in
``docs/plugins/huaweiNPU.md``."""
