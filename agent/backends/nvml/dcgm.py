"""Utilization of MIG GPU instances from DCGM, where DCGM is installed.

NVML has no utilization for MIG (nvml.h: "On MIG-enabled GPUs, querying device utilization
rates is not currently supported"). DCGM's profiling fields do: DCGM_FI_PROF_GR_ENGINE_ACTIVE
(field 1001, renamed DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO in DCGM 4.6) on a GPU instance entity
(DCGM_FE_GPU_I) is the ratio of time its graphics/compute engine was busy, the figure the
DCGM exporter reports for MIG. This module connects to the host engine (nv-hostengine) through
DCGM's own Python bindings, watches that field on every GPU instance, and reads the latest
values. No DCGM, or no host engine: `connect` answers None and MIG utilization stays null
("not available" in the console's charts).

GPUCLOUD_DCGM: the host engine's address (default 127.0.0.1), or "off".
"""

import logging
import os
import sys

log = logging.getLogger(__name__)

GR_ENGINE_ACTIVE = 1001  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
FP64_BLANK = 140737488355328.0  # dcgmvalue.DCGM_FP64_BLANK: values at or over it are no value
WATCH_MICROSECONDS = 1_000_000
KEEP_SECONDS = 60.0
# where DCGM's packages install their Python bindings (DCGM 4, then DCGM 3 and older)
BINDINGS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
)


def _modules():
    """DCGM's binding modules (dcgm_agent, dcgm_structs, dcgm_fields), or None."""
    for path in BINDINGS:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)
    try:
        import dcgm_agent  # optional: found at run time
        import dcgm_fields
        import dcgm_structs
    except ImportError:
        return None
    return dcgm_agent, dcgm_structs, dcgm_fields


def address() -> str | None:
    """The host engine to use, or None when GPUCLOUD_DCGM is "off"."""
    value = os.environ.get("GPUCLOUD_DCGM", "").strip()
    if value.lower() in ("off", "no", "0", "false"):
        return None
    return value or "127.0.0.1"


class MigUtilization:
    """Reads GR engine activity (0-100 %) of every MIG GPU instance, by (GPU index, GPU
    instance id)."""

    def __init__(self, agent, structs, fields, handle, where: str):
        self._agent, self._structs, self._fields = agent, structs, fields
        self._handle = handle
        self.where = where
        self._group = None
        self._field_group = None
        self._entities: dict[tuple[int, int], int] = {}
        self._failing = False

    def _hierarchy(self) -> dict[tuple[int, int], int]:
        hierarchy = self._agent.dcgmGetGpuInstanceHierarchy(self._handle)
        entities = {}
        for n in range(hierarchy.count):
            item = hierarchy.entityList[n]
            if item.entity.entityGroupId == self._fields.DCGM_FE_GPU_I:
                key = (item.info.nvmlGpuIndex, item.info.nvmlInstanceId)
                entities[key] = item.entity.entityId
        return entities

    def _watch(self, entities: dict[tuple[int, int], int]) -> None:
        """Watch the field on exactly these GPU instances (a new group when they change)."""
        agent, handle = self._agent, self._handle
        if self._group is not None:
            try:
                agent.dcgmGroupDestroy(handle, self._group)
            except self._structs.DCGMError as exc:
                log.debug("DCGM: could not drop the old group: %s", exc)
            self._group = None
        self._entities = {}
        if not entities:
            return
        tag = f"gpucloud-agent-{os.getpid()}"
        group = agent.dcgmGroupCreate(handle, self._structs.DCGM_GROUP_EMPTY, tag)
        self._group = group
        for entity in entities.values():
            agent.dcgmGroupAddEntity(handle, group, self._fields.DCGM_FE_GPU_I, entity)
        if self._field_group is None:
            self._field_group = agent.dcgmFieldGroupCreate(handle, [GR_ENGINE_ACTIVE], tag)
        agent.dcgmWatchFields(handle, group, self._field_group, WATCH_MICROSECONDS, KEEP_SECONDS, 0)
        self._entities = entities

    def read(self) -> dict[tuple[int, int], float | None]:
        try:
            entities = self._hierarchy()
            if entities != self._entities:
                self._watch(entities)
            if not entities:
                return {}
            pair = self._structs.c_dcgmGroupEntityPair_t
            pairs = [pair(self._fields.DCGM_FE_GPU_I, e) for e in entities.values()]
            values = self._agent.dcgmEntitiesGetLatestValues(
                self._handle, pairs, [GR_ENGINE_ACTIVE], 0
            )
        except self._structs.DCGMError as exc:
            if not self._failing:
                log.warning("DCGM (%s): MIG utilization not available: %s", self.where, exc)
            self._failing = True
            self._entities = {}  # watch again once DCGM answers
            return {}
        if self._failing:
            log.info("DCGM (%s) answers again", self.where)
        self._failing = False
        busy = {}
        for value in values:
            ratio = value.value.dbl
            if value.status == self._structs.DCGM_ST_OK and 0 <= ratio < FP64_BLANK:
                busy[value.entityId] = round(min(ratio, 1.0) * 100, 1)
        return {key: busy.get(entity) for key, entity in entities.items()}

    def close(self) -> None:
        try:
            self._agent.dcgmDisconnect(self._handle)
        except self._structs.DCGMError as exc:
            log.debug("DCGM: disconnect: %s", exc)


def connect() -> tuple[MigUtilization | None, str]:
    """A reader on the host engine and a line saying so, or None and why not."""
    where = address()
    if where is None:
        return None, "DCGM: off (GPUCLOUD_DCGM=off)"
    modules = _modules()
    if modules is None:
        return None, "DCGM: not installed (no dcgm_agent Python bindings)"
    agent, structs, fields = modules
    try:
        structs._dcgmInit()
        agent.dcgmInit()
        handle = agent.dcgmConnect(where)
    except (structs.DCGMError, OSError) as exc:
        return None, f"DCGM: no host engine at {where}: {exc}"
    reader = MigUtilization(agent, structs, fields, handle, where)
    return reader, f"DCGM: host engine at {where}; MIG utilization from GR engine activity"
