from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListEnvsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SplitInfo(_message.Message):
    __slots__ = ("name", "num_tasks", "categories", "tasks_per_category", "num_excluded", "description")
    class TasksPerCategoryEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    TASKS_PER_CATEGORY_FIELD_NUMBER: _ClassVar[int]
    NUM_EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_tasks: int
    categories: _containers.RepeatedScalarFieldContainer[str]
    tasks_per_category: _containers.ScalarMap[str, int]
    num_excluded: int
    description: str
    def __init__(self, name: _Optional[str] = ..., num_tasks: _Optional[int] = ..., categories: _Optional[_Iterable[str]] = ..., tasks_per_category: _Optional[_Mapping[str, int]] = ..., num_excluded: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("name", "version", "code_version", "data_hash", "splits", "default_max_turns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_HASH_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    code_version: str
    data_hash: str
    splits: _containers.RepeatedCompositeFieldContainer[SplitInfo]
    default_max_turns: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., code_version: _Optional[str] = ..., data_hash: _Optional[str] = ..., splits: _Optional[_Iterable[_Union[SplitInfo, _Mapping]]] = ..., default_max_turns: _Optional[int] = ...) -> None: ...

class ListEnvsResponse(_message.Message):
    __slots__ = ("envs", "server_version")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvInfo]
    server_version: str
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvInfo, _Mapping]]] = ..., server_version: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("env", "split", "page_size", "page_token")
    ENV_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    env: str
    split: str
    page_size: int
    page_token: str
    def __init__(self, env: _Optional[str] = ..., split: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("task_id", "category", "excluded_reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    category: str
    excluded_reason: str
    def __init__(self, task_id: _Optional[str] = ..., category: _Optional[str] = ..., excluded_reason: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("task_ids", "next_page_token", "tasks")
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("env", "split", "task_id", "seed", "episode_id", "options", "max_turns")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    env: str
    split: str
    task_id: str
    seed: int
    episode_id: str
    options: _containers.ScalarMap[str, str]
    max_turns: int
    def __init__(self, env: _Optional[str] = ..., split: _Optional[str] = ..., task_id: _Optional[str] = ..., seed: _Optional[int] = ..., episode_id: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., max_turns: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "step_index", "action")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step_index: int
    action: bytes
    def __init__(self, session_id: _Optional[str] = ..., step_index: _Optional[int] = ..., action: _Optional[bytes] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EpisodeRequest(_message.Message):
    __slots__ = ("reset", "step")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    reset: ResetRequest
    step: StepRequest
    def __init__(self, reset: _Optional[_Union[ResetRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ...) -> None: ...

class Transition(_message.Message):
    __slots__ = ("session_id", "step_index", "observation", "admissible_actions", "reward", "terminated", "truncated", "won", "score", "task_id", "task_category", "instruction", "info", "version", "env", "split", "episode_id", "seed")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ADMISSIBLE_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    WON_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_CATEGORY_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step_index: int
    observation: str
    admissible_actions: _containers.RepeatedScalarFieldContainer[str]
    reward: float
    terminated: bool
    truncated: bool
    won: bool
    score: float
    task_id: str
    task_category: str
    instruction: str
    info: _containers.ScalarMap[str, str]
    version: str
    env: str
    split: str
    episode_id: str
    seed: int
    def __init__(self, session_id: _Optional[str] = ..., step_index: _Optional[int] = ..., observation: _Optional[str] = ..., admissible_actions: _Optional[_Iterable[str]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., won: _Optional[bool] = ..., score: _Optional[float] = ..., task_id: _Optional[str] = ..., task_category: _Optional[str] = ..., instruction: _Optional[str] = ..., info: _Optional[_Mapping[str, str]] = ..., version: _Optional[str] = ..., env: _Optional[str] = ..., split: _Optional[str] = ..., episode_id: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("pid", "sessions", "rss_bytes", "episodes_served")
    PID_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    EPISODES_SERVED_FIELD_NUMBER: _ClassVar[int]
    pid: int
    sessions: int
    rss_bytes: int
    episodes_served: int
    def __init__(self, pid: _Optional[int] = ..., sessions: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., episodes_served: _Optional[int] = ...) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("active_sessions", "capacity", "draining", "worker_rss_bytes", "workers", "sessions_by_env", "server_id")
    class SessionsByEnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    WORKER_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_BY_ENV_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    active_sessions: int
    capacity: int
    draining: bool
    worker_rss_bytes: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerLoad]
    sessions_by_env: _containers.ScalarMap[str, int]
    server_id: str
    def __init__(self, active_sessions: _Optional[int] = ..., capacity: _Optional[int] = ..., draining: _Optional[bool] = ..., worker_rss_bytes: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerLoad, _Mapping]]] = ..., sessions_by_env: _Optional[_Mapping[str, int]] = ..., server_id: _Optional[str] = ...) -> None: ...
