import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUE_STATE_UNSPECIFIED: _ClassVar[QueueState]
    QUEUE_STATE_OPEN: _ClassVar[QueueState]
    QUEUE_STATE_CLOSING: _ClassVar[QueueState]
    QUEUE_STATE_CLOSED: _ClassVar[QueueState]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_PENDING: _ClassVar[TaskStatus]
    TASK_STATUS_ALLOCATED: _ClassVar[TaskStatus]
    TASK_STATUS_PIPELINED: _ClassVar[TaskStatus]
    TASK_STATUS_BINDING: _ClassVar[TaskStatus]
    TASK_STATUS_BOUND: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_RELEASING: _ClassVar[TaskStatus]
    TASK_STATUS_SUCCEEDED: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_UNKNOWN: _ClassVar[TaskStatus]

class JobPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_PHASE_UNSPECIFIED: _ClassVar[JobPhase]
    JOB_PHASE_PENDING: _ClassVar[JobPhase]
    JOB_PHASE_INQUEUE: _ClassVar[JobPhase]
    JOB_PHASE_RUNNING: _ClassVar[JobPhase]
    JOB_PHASE_COMPLETED: _ClassVar[JobPhase]
    JOB_PHASE_FAILED: _ClassVar[JobPhase]
    JOB_PHASE_CANCELLED: _ClassVar[JobPhase]
QUEUE_STATE_UNSPECIFIED: QueueState
QUEUE_STATE_OPEN: QueueState
QUEUE_STATE_CLOSING: QueueState
QUEUE_STATE_CLOSED: QueueState
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_PENDING: TaskStatus
TASK_STATUS_ALLOCATED: TaskStatus
TASK_STATUS_PIPELINED: TaskStatus
TASK_STATUS_BINDING: TaskStatus
TASK_STATUS_BOUND: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_RELEASING: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_UNKNOWN: TaskStatus
JOB_PHASE_UNSPECIFIED: JobPhase
JOB_PHASE_PENDING: JobPhase
JOB_PHASE_INQUEUE: JobPhase
JOB_PHASE_RUNNING: JobPhase
JOB_PHASE_COMPLETED: JobPhase
JOB_PHASE_FAILED: JobPhase
JOB_PHASE_CANCELLED: JobPhase

class ResourceList(_message.Message):
    __slots__ = ("quantities",)
    class QuantitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUANTITIES_FIELD_NUMBER: _ClassVar[int]
    quantities: _containers.ScalarMap[str, str]
    def __init__(self, quantities: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Taint(_message.Message):
    __slots__ = ("key", "value", "effect")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    effect: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ...) -> None: ...

class Toleration(_message.Message):
    __slots__ = ("key", "operator", "value", "effect", "toleration_seconds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    TOLERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    value: str
    effect: str
    toleration_seconds: int
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ..., toleration_seconds: _Optional[int] = ...) -> None: ...

class LabelSelectorRequirement(_message.Message):
    __slots__ = ("key", "operator", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class LabelSelector(_message.Message):
    __slots__ = ("match_labels", "match_expressions")
    class MatchLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MATCH_LABELS_FIELD_NUMBER: _ClassVar[int]
    MATCH_EXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    match_labels: _containers.ScalarMap[str, str]
    match_expressions: _containers.RepeatedCompositeFieldContainer[LabelSelectorRequirement]
    def __init__(self, match_labels: _Optional[_Mapping[str, str]] = ..., match_expressions: _Optional[_Iterable[_Union[LabelSelectorRequirement, _Mapping]]] = ...) -> None: ...

class NodeSelectorTerm(_message.Message):
    __slots__ = ("match_expressions", "match_fields")
    MATCH_EXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELDS_FIELD_NUMBER: _ClassVar[int]
    match_expressions: _containers.RepeatedCompositeFieldContainer[LabelSelectorRequirement]
    match_fields: _containers.RepeatedCompositeFieldContainer[LabelSelectorRequirement]
    def __init__(self, match_expressions: _Optional[_Iterable[_Union[LabelSelectorRequirement, _Mapping]]] = ..., match_fields: _Optional[_Iterable[_Union[LabelSelectorRequirement, _Mapping]]] = ...) -> None: ...

class PreferredSchedulingTerm(_message.Message):
    __slots__ = ("weight", "preference")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    weight: int
    preference: NodeSelectorTerm
    def __init__(self, weight: _Optional[int] = ..., preference: _Optional[_Union[NodeSelectorTerm, _Mapping]] = ...) -> None: ...

class NodeAffinity(_message.Message):
    __slots__ = ("required", "preferred")
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    required: _containers.RepeatedCompositeFieldContainer[NodeSelectorTerm]
    preferred: _containers.RepeatedCompositeFieldContainer[PreferredSchedulingTerm]
    def __init__(self, required: _Optional[_Iterable[_Union[NodeSelectorTerm, _Mapping]]] = ..., preferred: _Optional[_Iterable[_Union[PreferredSchedulingTerm, _Mapping]]] = ...) -> None: ...

class PodAffinityTerm(_message.Message):
    __slots__ = ("label_selector", "namespaces", "topology_key")
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_KEY_FIELD_NUMBER: _ClassVar[int]
    label_selector: LabelSelector
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    topology_key: str
    def __init__(self, label_selector: _Optional[_Union[LabelSelector, _Mapping]] = ..., namespaces: _Optional[_Iterable[str]] = ..., topology_key: _Optional[str] = ...) -> None: ...

class WeightedPodAffinityTerm(_message.Message):
    __slots__ = ("weight", "term")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    weight: int
    term: PodAffinityTerm
    def __init__(self, weight: _Optional[int] = ..., term: _Optional[_Union[PodAffinityTerm, _Mapping]] = ...) -> None: ...

class PodAffinity(_message.Message):
    __slots__ = ("required", "preferred")
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    required: _containers.RepeatedCompositeFieldContainer[PodAffinityTerm]
    preferred: _containers.RepeatedCompositeFieldContainer[WeightedPodAffinityTerm]
    def __init__(self, required: _Optional[_Iterable[_Union[PodAffinityTerm, _Mapping]]] = ..., preferred: _Optional[_Iterable[_Union[WeightedPodAffinityTerm, _Mapping]]] = ...) -> None: ...

class Affinity(_message.Message):
    __slots__ = ("node_affinity", "pod_affinity", "pod_anti_affinity")
    NODE_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    POD_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    POD_ANTI_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    node_affinity: NodeAffinity
    pod_affinity: PodAffinity
    pod_anti_affinity: PodAffinity
    def __init__(self, node_affinity: _Optional[_Union[NodeAffinity, _Mapping]] = ..., pod_affinity: _Optional[_Union[PodAffinity, _Mapping]] = ..., pod_anti_affinity: _Optional[_Union[PodAffinity, _Mapping]] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("type", "status", "reason", "message", "last_transition_time", "cycle_id")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_TRANSITION_TIME_FIELD_NUMBER: _ClassVar[int]
    CYCLE_ID_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: _timestamp_pb2.Timestamp
    cycle_id: int
    def __init__(self, type: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., last_transition_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cycle_id: _Optional[int] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("id", "type", "healthy", "group", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    healthy: bool
    group: str
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., healthy: _Optional[bool] = ..., group: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "backend", "allocatable", "labels", "taints", "unschedulable", "devices", "not_ready")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ALLOCATABLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TAINTS_FIELD_NUMBER: _ClassVar[int]
    UNSCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend: str
    allocatable: ResourceList
    labels: _containers.ScalarMap[str, str]
    taints: _containers.RepeatedCompositeFieldContainer[Taint]
    unschedulable: bool
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    not_ready: bool
    def __init__(self, name: _Optional[str] = ..., backend: _Optional[str] = ..., allocatable: _Optional[_Union[ResourceList, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., taints: _Optional[_Iterable[_Union[Taint, _Mapping]]] = ..., unschedulable: _Optional[bool] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., not_ready: _Optional[bool] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("node", "used", "idle", "task_count", "device_holders", "shared_gpus", "not_ready_reason", "backend_last_contact")
    class DeviceHoldersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SharedGpusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    SHARED_GPUS_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_REASON_FIELD_NUMBER: _ClassVar[int]
    BACKEND_LAST_CONTACT_FIELD_NUMBER: _ClassVar[int]
    node: Node
    used: ResourceList
    idle: ResourceList
    task_count: int
    device_holders: _containers.ScalarMap[str, str]
    shared_gpus: _containers.ScalarMap[str, float]
    not_ready_reason: str
    backend_last_contact: _timestamp_pb2.Timestamp
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ..., used: _Optional[_Union[ResourceList, _Mapping]] = ..., idle: _Optional[_Union[ResourceList, _Mapping]] = ..., task_count: _Optional[int] = ..., device_holders: _Optional[_Mapping[str, str]] = ..., shared_gpus: _Optional[_Mapping[str, float]] = ..., not_ready_reason: _Optional[str] = ..., backend_last_contact: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "parent", "weight", "guarantee", "deserved", "capability", "priority", "reclaimable", "state", "annotations", "default_time_limit_seconds", "max_time_limit_seconds")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    DESERVED_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    RECLAIMABLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIME_LIMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TIME_LIMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    weight: int
    guarantee: ResourceList
    deserved: ResourceList
    capability: ResourceList
    priority: int
    reclaimable: bool
    state: QueueState
    annotations: _containers.ScalarMap[str, str]
    default_time_limit_seconds: int
    max_time_limit_seconds: int
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., weight: _Optional[int] = ..., guarantee: _Optional[_Union[ResourceList, _Mapping]] = ..., deserved: _Optional[_Union[ResourceList, _Mapping]] = ..., capability: _Optional[_Union[ResourceList, _Mapping]] = ..., priority: _Optional[int] = ..., reclaimable: _Optional[bool] = ..., state: _Optional[_Union[QueueState, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., default_time_limit_seconds: _Optional[int] = ..., max_time_limit_seconds: _Optional[int] = ...) -> None: ...

class QueueView(_message.Message):
    __slots__ = ("queue", "allocated", "pending_jobs", "running_jobs")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    allocated: ResourceList
    pending_jobs: int
    running_jobs: int
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ..., allocated: _Optional[_Union[ResourceList, _Mapping]] = ..., pending_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ...) -> None: ...

class TaskGroup(_message.Message):
    __slots__ = ("role", "replicas", "request", "node_selector", "tolerations", "affinity", "labels", "annotations", "command", "duration_seconds", "priority", "preemptable", "sub_group", "gpu_fraction")
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTABLE_FIELD_NUMBER: _ClassVar[int]
    SUB_GROUP_FIELD_NUMBER: _ClassVar[int]
    GPU_FRACTION_FIELD_NUMBER: _ClassVar[int]
    role: str
    replicas: int
    request: ResourceList
    node_selector: _containers.ScalarMap[str, str]
    tolerations: _containers.RepeatedCompositeFieldContainer[Toleration]
    affinity: Affinity
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    command: _containers.RepeatedScalarFieldContainer[str]
    duration_seconds: float
    priority: int
    preemptable: bool
    sub_group: str
    gpu_fraction: float
    def __init__(self, role: _Optional[str] = ..., replicas: _Optional[int] = ..., request: _Optional[_Union[ResourceList, _Mapping]] = ..., node_selector: _Optional[_Mapping[str, str]] = ..., tolerations: _Optional[_Iterable[_Union[Toleration, _Mapping]]] = ..., affinity: _Optional[_Union[Affinity, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., command: _Optional[_Iterable[str]] = ..., duration_seconds: _Optional[float] = ..., priority: _Optional[int] = ..., preemptable: _Optional[bool] = ..., sub_group: _Optional[str] = ..., gpu_fraction: _Optional[float] = ...) -> None: ...

class SubGroup(_message.Message):
    __slots__ = ("name", "min_member")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_MEMBER_FIELD_NUMBER: _ClassVar[int]
    name: str
    min_member: int
    def __init__(self, name: _Optional[str] = ..., min_member: _Optional[int] = ...) -> None: ...

class NetworkTopology(_message.Message):
    __slots__ = ("mode", "highest_tier_allowed")
    MODE_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_TIER_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    mode: str
    highest_tier_allowed: int
    def __init__(self, mode: _Optional[str] = ..., highest_tier_allowed: _Optional[int] = ...) -> None: ...

class TYJob(_message.Message):
    __slots__ = ("leader_role", "min_workers_num", "restart_limit", "clean_pod_policy", "scheduler_policy")
    LEADER_ROLE_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_NUM_FIELD_NUMBER: _ClassVar[int]
    RESTART_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CLEAN_POD_POLICY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_POLICY_FIELD_NUMBER: _ClassVar[int]
    leader_role: str
    min_workers_num: int
    restart_limit: int
    clean_pod_policy: str
    scheduler_policy: TYSchedulerPolicy
    def __init__(self, leader_role: _Optional[str] = ..., min_workers_num: _Optional[int] = ..., restart_limit: _Optional[int] = ..., clean_pod_policy: _Optional[str] = ..., scheduler_policy: _Optional[_Union[TYSchedulerPolicy, _Mapping]] = ...) -> None: ...

class TYSchedulerPolicy(_message.Message):
    __slots__ = ("job_queue_policy", "basic_policy")
    JOB_QUEUE_POLICY_FIELD_NUMBER: _ClassVar[int]
    BASIC_POLICY_FIELD_NUMBER: _ClassVar[int]
    job_queue_policy: str
    basic_policy: str
    def __init__(self, job_queue_policy: _Optional[str] = ..., basic_policy: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("id", "namespace", "name", "queue", "priority", "priority_class", "min_member", "min_task_member", "min_resources", "task_groups", "preemptible", "sub_groups", "network_topology", "annotations", "tyjob", "owner", "hold", "array", "depends_on", "array_job_id", "array_index", "time_limit_seconds")
    class MinTaskMemberEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    MIN_MEMBER_FIELD_NUMBER: _ClassVar[int]
    MIN_TASK_MEMBER_FIELD_NUMBER: _ClassVar[int]
    MIN_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    TASK_GROUPS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    SUB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    TYJOB_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    namespace: str
    name: str
    queue: str
    priority: int
    priority_class: str
    min_member: int
    min_task_member: _containers.ScalarMap[str, int]
    min_resources: ResourceList
    task_groups: _containers.RepeatedCompositeFieldContainer[TaskGroup]
    preemptible: bool
    sub_groups: _containers.RepeatedCompositeFieldContainer[SubGroup]
    network_topology: NetworkTopology
    annotations: _containers.ScalarMap[str, str]
    tyjob: TYJob
    owner: str
    hold: bool
    array: str
    depends_on: _containers.RepeatedCompositeFieldContainer[JobDependency]
    array_job_id: str
    array_index: int
    time_limit_seconds: int
    def __init__(self, id: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., queue: _Optional[str] = ..., priority: _Optional[int] = ..., priority_class: _Optional[str] = ..., min_member: _Optional[int] = ..., min_task_member: _Optional[_Mapping[str, int]] = ..., min_resources: _Optional[_Union[ResourceList, _Mapping]] = ..., task_groups: _Optional[_Iterable[_Union[TaskGroup, _Mapping]]] = ..., preemptible: _Optional[bool] = ..., sub_groups: _Optional[_Iterable[_Union[SubGroup, _Mapping]]] = ..., network_topology: _Optional[_Union[NetworkTopology, _Mapping]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., tyjob: _Optional[_Union[TYJob, _Mapping]] = ..., owner: _Optional[str] = ..., hold: _Optional[bool] = ..., array: _Optional[str] = ..., depends_on: _Optional[_Iterable[_Union[JobDependency, _Mapping]]] = ..., array_job_id: _Optional[str] = ..., array_index: _Optional[int] = ..., time_limit_seconds: _Optional[int] = ...) -> None: ...

class JobDependency(_message.Message):
    __slots__ = ("job", "type")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    job: str
    type: str
    def __init__(self, job: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "job_id", "role", "index", "status", "node", "devices", "backend", "message", "exit_code", "gpu_group")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    GPU_GROUP_FIELD_NUMBER: _ClassVar[int]
    id: str
    job_id: str
    role: str
    index: int
    status: TaskStatus
    node: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    backend: str
    message: str
    exit_code: int
    gpu_group: str
    def __init__(self, id: _Optional[str] = ..., job_id: _Optional[str] = ..., role: _Optional[str] = ..., index: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., node: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., backend: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., gpu_group: _Optional[str] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("phase", "conditions", "pending", "running", "succeeded", "failed", "submit_time", "start_time", "finish_time", "stage", "schedule_state", "leader_restarts", "cancelled", "hold", "held_by", "requeue_count", "unknown", "estimated_start", "estimated_nodes", "reserved", "estimate_note")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_STATE_FIELD_NUMBER: _ClassVar[int]
    LEADER_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_START_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_NODES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_NOTE_FIELD_NUMBER: _ClassVar[int]
    phase: JobPhase
    conditions: _containers.RepeatedCompositeFieldContainer[Condition]
    pending: int
    running: int
    succeeded: int
    failed: int
    submit_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    stage: str
    schedule_state: str
    leader_restarts: int
    cancelled: int
    hold: str
    held_by: str
    requeue_count: int
    unknown: int
    estimated_start: _timestamp_pb2.Timestamp
    estimated_nodes: _containers.RepeatedScalarFieldContainer[str]
    reserved: bool
    estimate_note: str
    def __init__(self, phase: _Optional[_Union[JobPhase, str]] = ..., conditions: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., pending: _Optional[int] = ..., running: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stage: _Optional[str] = ..., schedule_state: _Optional[str] = ..., leader_restarts: _Optional[int] = ..., cancelled: _Optional[int] = ..., hold: _Optional[str] = ..., held_by: _Optional[str] = ..., requeue_count: _Optional[int] = ..., unknown: _Optional[int] = ..., estimated_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., estimated_nodes: _Optional[_Iterable[str]] = ..., reserved: _Optional[bool] = ..., estimate_note: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("spec", "status", "tasks")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    status: JobStatus
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., status: _Optional[_Union[JobStatus, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class RegisterBackendRequest(_message.Message):
    __slots__ = ("name", "kind", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterBackendResponse(_message.Message):
    __slots__ = ("name", "server_id", "last_decision_id", "heartbeat_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    server_id: str
    last_decision_id: int
    heartbeat_seconds: float
    def __init__(self, name: _Optional[str] = ..., server_id: _Optional[str] = ..., last_decision_id: _Optional[int] = ..., heartbeat_seconds: _Optional[float] = ...) -> None: ...

class BackendTask(_message.Message):
    __slots__ = ("task_id", "node", "request", "status", "foreign_task", "devices", "gpu_fraction", "gpu_group")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_TASK_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    GPU_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GPU_GROUP_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    node: str
    request: ResourceList
    status: TaskStatus
    foreign_task: bool
    devices: _containers.RepeatedScalarFieldContainer[str]
    gpu_fraction: float
    gpu_group: str
    def __init__(self, task_id: _Optional[str] = ..., node: _Optional[str] = ..., request: _Optional[_Union[ResourceList, _Mapping]] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., foreign_task: _Optional[bool] = ..., devices: _Optional[_Iterable[str]] = ..., gpu_fraction: _Optional[float] = ..., gpu_group: _Optional[str] = ...) -> None: ...

class SyncSnapshotRequest(_message.Message):
    __slots__ = ("backend", "nodes", "tasks")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    tasks: _containers.RepeatedCompositeFieldContainer[BackendTask]
    def __init__(self, backend: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., tasks: _Optional[_Iterable[_Union[BackendTask, _Mapping]]] = ...) -> None: ...

class SyncSnapshotResponse(_message.Message):
    __slots__ = ("nodes", "tasks")
    NODES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    tasks: int
    def __init__(self, nodes: _Optional[int] = ..., tasks: _Optional[int] = ...) -> None: ...

class TaskStatusUpdate(_message.Message):
    __slots__ = ("task_id", "status", "node", "message", "exit_code")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    status: TaskStatus
    node: str
    message: str
    exit_code: int
    def __init__(self, task_id: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., node: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("node_upserted", "node_removed", "task_status", "foreign_task_upserted", "foreign_task_removed", "task_log")
    NODE_UPSERTED_FIELD_NUMBER: _ClassVar[int]
    NODE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    TASK_STATUS_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_TASK_UPSERTED_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_TASK_REMOVED_FIELD_NUMBER: _ClassVar[int]
    TASK_LOG_FIELD_NUMBER: _ClassVar[int]
    node_upserted: Node
    node_removed: str
    task_status: TaskStatusUpdate
    foreign_task_upserted: BackendTask
    foreign_task_removed: str
    task_log: TaskLogChunk
    def __init__(self, node_upserted: _Optional[_Union[Node, _Mapping]] = ..., node_removed: _Optional[str] = ..., task_status: _Optional[_Union[TaskStatusUpdate, _Mapping]] = ..., foreign_task_upserted: _Optional[_Union[BackendTask, _Mapping]] = ..., foreign_task_removed: _Optional[str] = ..., task_log: _Optional[_Union[TaskLogChunk, _Mapping]] = ...) -> None: ...

class TaskLogChunk(_message.Message):
    __slots__ = ("task_id", "data", "eof")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    data: bytes
    eof: bool
    def __init__(self, task_id: _Optional[str] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class SendDeltasRequest(_message.Message):
    __slots__ = ("backend", "deltas")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    deltas: _containers.RepeatedCompositeFieldContainer[Delta]
    def __init__(self, backend: _Optional[str] = ..., deltas: _Optional[_Iterable[_Union[Delta, _Mapping]]] = ...) -> None: ...

class SendDeltasResponse(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    def __init__(self, applied: _Optional[int] = ...) -> None: ...

class StreamDecisionsRequest(_message.Message):
    __slots__ = ("backend", "after_decision_id", "max_batch")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    AFTER_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    backend: str
    after_decision_id: int
    max_batch: int
    def __init__(self, backend: _Optional[str] = ..., after_decision_id: _Optional[int] = ..., max_batch: _Optional[int] = ...) -> None: ...

class BindDecision(_message.Message):
    __slots__ = ("task_id", "job_id", "node", "devices", "request", "command", "duration_seconds", "pipelined", "annotations", "gpu_fraction", "min_member", "gpu_group", "env", "time_limit_seconds")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PIPELINED_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    GPU_FRACTION_FIELD_NUMBER: _ClassVar[int]
    MIN_MEMBER_FIELD_NUMBER: _ClassVar[int]
    GPU_GROUP_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    node: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    request: ResourceList
    command: _containers.RepeatedScalarFieldContainer[str]
    duration_seconds: float
    pipelined: bool
    annotations: _containers.ScalarMap[str, str]
    gpu_fraction: float
    min_member: int
    gpu_group: str
    env: _containers.ScalarMap[str, str]
    time_limit_seconds: int
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., node: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., request: _Optional[_Union[ResourceList, _Mapping]] = ..., command: _Optional[_Iterable[str]] = ..., duration_seconds: _Optional[float] = ..., pipelined: _Optional[bool] = ..., annotations: _Optional[_Mapping[str, str]] = ..., gpu_fraction: _Optional[float] = ..., min_member: _Optional[int] = ..., gpu_group: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., time_limit_seconds: _Optional[int] = ...) -> None: ...

class EvictDecision(_message.Message):
    __slots__ = ("task_id", "job_id", "node", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    job_id: str
    node: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., job_id: _Optional[str] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("id", "cycle_id", "backend", "bind", "evict", "created", "deadline", "trace_context", "term")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    CYCLE_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    id: int
    cycle_id: int
    backend: str
    bind: BindDecision
    evict: EvictDecision
    created: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    trace_context: _containers.ScalarMap[str, str]
    term: int
    def __init__(self, id: _Optional[int] = ..., cycle_id: _Optional[int] = ..., backend: _Optional[str] = ..., bind: _Optional[_Union[BindDecision, _Mapping]] = ..., evict: _Optional[_Union[EvictDecision, _Mapping]] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., term: _Optional[int] = ...) -> None: ...

class DecisionBatch(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class DecisionAck(_message.Message):
    __slots__ = ("decision_id", "applied", "reason")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    decision_id: int
    applied: bool
    reason: str
    def __init__(self, decision_id: _Optional[int] = ..., applied: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AckDecisionsRequest(_message.Message):
    __slots__ = ("backend", "acks")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    acks: _containers.RepeatedCompositeFieldContainer[DecisionAck]
    def __init__(self, backend: _Optional[str] = ..., acks: _Optional[_Iterable[_Union[DecisionAck, _Mapping]]] = ...) -> None: ...

class AckDecisionsResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("backend",)
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    backend: str
    def __init__(self, backend: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("resync", "heartbeat_seconds")
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    resync: bool
    heartbeat_seconds: float
    def __init__(self, resync: _Optional[bool] = ..., heartbeat_seconds: _Optional[float] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "created", "element_ids")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    element_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ..., element_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetTaskLogsRequest(_message.Message):
    __slots__ = ("job_id", "task_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_id: str
    def __init__(self, job_id: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class TaskLog(_message.Message):
    __slots__ = ("task_id", "data", "truncated", "eof", "dropped_bytes", "size")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    data: bytes
    truncated: bool
    eof: bool
    dropped_bytes: int
    size: int
    def __init__(self, task_id: _Optional[str] = ..., data: _Optional[bytes] = ..., truncated: _Optional[bool] = ..., eof: _Optional[bool] = ..., dropped_bytes: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class GetTaskLogsResponse(_message.Message):
    __slots__ = ("logs",)
    LOGS_FIELD_NUMBER: _ClassVar[int]
    logs: _containers.RepeatedCompositeFieldContainer[TaskLog]
    def __init__(self, logs: _Optional[_Iterable[_Union[TaskLog, _Mapping]]] = ...) -> None: ...

class WatchTaskLogsRequest(_message.Message):
    __slots__ = ("job_id", "task_id", "offsets")
    class OffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    task_id: str
    offsets: _containers.ScalarMap[str, int]
    def __init__(self, job_id: _Optional[str] = ..., task_id: _Optional[str] = ..., offsets: _Optional[_Mapping[str, int]] = ...) -> None: ...

class TaskLogEvent(_message.Message):
    __slots__ = ("task_id", "data", "offset", "dropped_bytes", "eof")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    data: bytes
    offset: int
    dropped_bytes: int
    eof: bool
    def __init__(self, task_id: _Optional[str] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., dropped_bytes: _Optional[int] = ..., eof: _Optional[bool] = ...) -> None: ...

class ListJobHistoryRequest(_message.Message):
    __slots__ = ("queue", "owner", "phases", "finished_after", "finished_before", "page_size", "page_token", "namespace")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AFTER_FIELD_NUMBER: _ClassVar[int]
    FINISHED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    owner: str
    phases: _containers.RepeatedScalarFieldContainer[JobPhase]
    finished_after: _timestamp_pb2.Timestamp
    finished_before: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    namespace: str
    def __init__(self, queue: _Optional[str] = ..., owner: _Optional[str] = ..., phases: _Optional[_Iterable[_Union[JobPhase, str]]] = ..., finished_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class JobAccounting(_message.Message):
    __slots__ = ("job_id", "name", "namespace", "queue", "owner", "phase", "submit_time", "start_time", "finish_time", "elapsed_seconds", "tasks", "succeeded", "failed", "cancelled", "requested", "used", "exit_codes", "reason", "requeue_count")
    class RequestedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class UsedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ExitCodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    namespace: str
    queue: str
    owner: str
    phase: JobPhase
    submit_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    elapsed_seconds: float
    tasks: int
    succeeded: int
    failed: int
    cancelled: int
    requested: _containers.ScalarMap[str, float]
    used: _containers.ScalarMap[str, float]
    exit_codes: _containers.ScalarMap[int, int]
    reason: str
    requeue_count: int
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., queue: _Optional[str] = ..., owner: _Optional[str] = ..., phase: _Optional[_Union[JobPhase, str]] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., elapsed_seconds: _Optional[float] = ..., tasks: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., cancelled: _Optional[int] = ..., requested: _Optional[_Mapping[str, float]] = ..., used: _Optional[_Mapping[str, float]] = ..., exit_codes: _Optional[_Mapping[int, int]] = ..., reason: _Optional[str] = ..., requeue_count: _Optional[int] = ...) -> None: ...

class ListJobHistoryResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobAccounting]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobAccounting, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SubmitJobsRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSpec]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobSpec, _Mapping]]] = ...) -> None: ...

class SubmitJobsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitJobResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitJobResponse, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job", "element_ids")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    job: Job
    element_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., element_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HoldJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ReleaseJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RequeueJobRequest(_message.Message):
    __slots__ = ("id", "hold")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    id: str
    hold: bool
    def __init__(self, id: _Optional[str] = ..., hold: _Optional[bool] = ...) -> None: ...

class JobControlResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("queue", "namespace", "phases", "page_size", "page_token", "owner")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    namespace: str
    phases: _containers.RepeatedScalarFieldContainer[JobPhase]
    page_size: int
    page_token: str
    owner: str
    def __init__(self, queue: _Optional[str] = ..., namespace: _Optional[str] = ..., phases: _Optional[_Iterable[_Union[JobPhase, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("queue", "namespace", "job_id", "send_initial")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEND_INITIAL_FIELD_NUMBER: _ClassVar[int]
    queue: str
    namespace: str
    job_id: str
    send_initial: bool
    def __init__(self, queue: _Optional[str] = ..., namespace: _Optional[str] = ..., job_id: _Optional[str] = ..., send_initial: _Optional[bool] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("type", "job", "revision")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[JobEvent.Type]
        TYPE_ADDED: _ClassVar[JobEvent.Type]
        TYPE_MODIFIED: _ClassVar[JobEvent.Type]
        TYPE_DELETED: _ClassVar[JobEvent.Type]
    TYPE_UNSPECIFIED: JobEvent.Type
    TYPE_ADDED: JobEvent.Type
    TYPE_MODIFIED: JobEvent.Type
    TYPE_DELETED: JobEvent.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    type: JobEvent.Type
    job: Job
    revision: int
    def __init__(self, type: _Optional[_Union[JobEvent.Type, str]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class QueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueView]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueView, _Mapping]]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("backend",)
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    backend: str
    def __init__(self, backend: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeView]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ...) -> None: ...

class ListServersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("id", "address", "role", "term", "last_renewal", "lag_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_RENEWAL_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    role: str
    term: int
    last_renewal: _timestamp_pb2.Timestamp
    lag_seconds: float
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., last_renewal: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lag_seconds: _Optional[float] = ...) -> None: ...

class ListServersResponse(_message.Message):
    __slots__ = ("servers", "leader", "term")
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[ServerInfo]
    leader: str
    term: int
    def __init__(self, servers: _Optional[_Iterable[_Union[ServerInfo, _Mapping]]] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerConfig(_message.Message):
    __slots__ = ("yaml", "generation")
    YAML_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    generation: int
    def __init__(self, yaml: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class UpdateConfigRequest(_message.Message):
    __slots__ = ("yaml",)
    YAML_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    def __init__(self, yaml: _Optional[str] = ...) -> None: ...

class SimulateRequest(_message.Message):
    __slots__ = ("scenario", "cycles")
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    scenario: str
    cycles: int
    def __init__(self, scenario: _Optional[str] = ..., cycles: _Optional[int] = ...) -> None: ...

class SimulateResponse(_message.Message):
    __slots__ = ("result_json",)
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    result_json: str
    def __init__(self, result_json: _Optional[str] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("job_id", "phase", "cycle_id", "gate", "summary", "node_reasons", "estimated_start", "estimated_nodes", "reserved", "estimate_note")
    class NodeReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CYCLE_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    NODE_REASONS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_START_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_NODES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_NOTE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    phase: JobPhase
    cycle_id: int
    gate: str
    summary: str
    node_reasons: _containers.ScalarMap[str, int]
    estimated_start: _timestamp_pb2.Timestamp
    estimated_nodes: _containers.RepeatedScalarFieldContainer[str]
    reserved: bool
    estimate_note: str
    def __init__(self, job_id: _Optional[str] = ..., phase: _Optional[_Union[JobPhase, str]] = ..., cycle_id: _Optional[int] = ..., gate: _Optional[str] = ..., summary: _Optional[str] = ..., node_reasons: _Optional[_Mapping[str, int]] = ..., estimated_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., estimated_nodes: _Optional[_Iterable[str]] = ..., reserved: _Optional[bool] = ..., estimate_note: _Optional[str] = ...) -> None: ...
