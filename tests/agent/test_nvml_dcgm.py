"""MIG utilization from DCGM, against fake DCGM binding modules shaped as DCGM's own
(testing/python3/dcgm_agent.py, dcgm_structs.py, dcgm_fields.py in NVIDIA/DCGM)."""

import sys
import types

import pytest

from agent.backends.nvml import dcgm as nvml_dcgm

GPU_I = 4  # dcgm_fields.DCGM_FE_GPU_I


class DCGMError(Exception):
    pass


def _ns(**fields):
    return types.SimpleNamespace(**fields)


class FakeDcgm:
    """The host engine: GPU instance entities by (GPU index, GPU instance id)."""

    def __init__(self, instances: dict[tuple[int, int], tuple[int, float]]):
        self.instances = instances  # (gpu, gi) -> (entity id, busy ratio)
        self.watched: list[list[int]] = []
        self.fail = False
        self.calls: list[str] = []

    def modules(self):
        agent = types.ModuleType("dcgm_agent")
        structs = types.ModuleType("dcgm_structs")
        fields = types.ModuleType("dcgm_fields")
        structs.DCGMError = DCGMError
        structs.DCGM_ST_OK = 0
        structs.DCGM_GROUP_EMPTY = 1
        structs.c_dcgmGroupEntityPair_t = lambda group, entity: _ns(
            entityGroupId=group, entityId=entity
        )
        structs._dcgmInit = lambda: None
        fields.DCGM_FE_GPU_I = GPU_I
        for name in dir(self):
            if name.startswith("dcgm"):
                setattr(agent, name, self._recorded(name, getattr(self, name)))
        return {"dcgm_agent": agent, "dcgm_structs": structs, "dcgm_fields": fields}

    def _recorded(self, name, fn):
        def call(*args):
            self.calls.append(name)
            if self.fail:
                raise DCGMError("connection to the host engine lost")
            return fn(*args)

        return call

    def dcgmInit(self):
        return 0

    def dcgmConnect(self, where):
        return f"handle:{where}"

    def dcgmDisconnect(self, handle):
        return 0

    def dcgmGetGpuInstanceHierarchy(self, handle):
        items = [
            _ns(
                entity=_ns(entityGroupId=GPU_I, entityId=entity),
                info=_ns(nvmlGpuIndex=gpu, nvmlInstanceId=gi),
            )
            for (gpu, gi), (entity, _) in self.instances.items()
        ]
        items.append(_ns(entity=_ns(entityGroupId=5, entityId=99), info=None))  # a CI entity
        return _ns(count=len(items), entityList=items)

    def dcgmGroupCreate(self, handle, kind, name):
        self.group = []
        return "group"

    def dcgmGroupAddEntity(self, handle, group, kind, entity):
        assert kind == GPU_I
        self.group.append(entity)

    def dcgmGroupDestroy(self, handle, group):
        return 0

    def dcgmFieldGroupCreate(self, handle, field_ids, name):
        assert field_ids == [1001]  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
        return "fields"

    def dcgmWatchFields(self, handle, group, field_group, every_us, keep_s, keep_samples):
        self.watched.append(sorted(self.group))

    def dcgmEntitiesGetLatestValues(self, handle, pairs, field_ids, flags):
        busy = {entity: ratio for entity, ratio in self.instances.values()}
        return [
            _ns(entityId=p.entityId, fieldId=1001, status=0, value=_ns(dbl=busy[p.entityId]))
            for p in pairs
        ]


@pytest.fixture
def dcgm(monkeypatch):
    not_supported = nvml_dcgm.FP64_BLANK + 2  # dcgmvalue.DCGM_FP64_NOT_SUPPORTED
    fake = FakeDcgm({(0, 1): (11, 0.735), (0, 2): (12, 0.0), (1, 7): (13, not_supported)})
    monkeypatch.setattr(nvml_dcgm, "BINDINGS", ())
    for name, module in fake.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("GPUCLOUD_DCGM", raising=False)
    return fake


def test_gr_engine_activity_of_every_gpu_instance(dcgm):
    reader, line = nvml_dcgm.connect()
    assert "host engine at 127.0.0.1" in line
    # blank values (at or over DCGM_FP64_BLANK) are no value, not 0
    assert reader.read() == {(0, 1): 73.5, (0, 2): 0.0, (1, 7): None}
    assert reader.read() == {(0, 1): 73.5, (0, 2): 0.0, (1, 7): None}
    assert dcgm.watched == [[11, 12, 13]]  # watched once while the instances stay

    dcgm.instances[(0, 3)] = (14, 0.5)  # a MIG device was created: watched again
    assert reader.read()[(0, 3)] == 50.0
    assert dcgm.watched[-1] == [11, 12, 13, 14]


def test_a_failing_host_engine_gives_no_values(dcgm, caplog):
    reader, _ = nvml_dcgm.connect()
    dcgm.fail = True
    assert reader.read() == {} and reader.read() == {}
    assert caplog.text.count("MIG utilization not available") == 1  # logged once
    dcgm.fail = False
    assert reader.read()[(0, 1)] == 73.5


def test_without_dcgm_there_is_no_reader(monkeypatch):
    monkeypatch.setattr(nvml_dcgm, "BINDINGS", ())
    monkeypatch.setitem(sys.modules, "dcgm_agent", None)  # import fails
    reader, line = nvml_dcgm.connect()
    assert reader is None and "not installed" in line
    monkeypatch.setenv("GPUCLOUD_DCGM", "off")
    assert nvml_dcgm.connect() == (None, "DCGM: off (GPUCLOUD_DCGM=off)")


def test_no_host_engine(dcgm, monkeypatch):
    def refuse(where):
        raise DCGMError("Host engine connection invalid/disconnected")

    monkeypatch.setattr(sys.modules["dcgm_agent"], "dcgmConnect", refuse)
    monkeypatch.setenv("GPUCLOUD_DCGM", "10.0.0.5")
    reader, line = nvml_dcgm.connect()
    assert reader is None and line.startswith("DCGM: no host engine at 10.0.0.5")


def test_the_backend_reads_mig_utilization_from_the_host_engine(dcgm, nvml):
    from agent.backends.nvml import AUTO
    from tests.agent.fake_nvml import gpu, mig_device

    mig = gpu(0, mig=(1, 1), instances=[mig_device("MIG-a", gi=1, start=0, profile="3g.40gb")])
    _, backend = nvml([mig, gpu(1)], dcgm=AUTO)
    samples = backend.sample([])
    [device] = [s for s in samples if s["kind"] == "mig"]
    assert device["gpu_util"] == 73.5
    assert backend.dcgm_status.startswith("DCGM: host engine")


def test_no_dcgm_is_tried_without_mig(dcgm, nvml):
    from agent.backends.nvml import AUTO
    from tests.agent.fake_nvml import gpu

    _, backend = nvml([gpu(0)], dcgm=AUTO)
    backend.sample([])
    assert dcgm.calls == []
