"""The demo: a plausible catalog of real GPU models, two tenants, and their users.
`seed_demo` loads it; loading it again changes nothing."""

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import services
from accounts.models import Membership, Tenant
from accounts.roles import Role
from console.catalog.models import GpuModel, Image, MigProfile, Mode, Region, Spec

REGION = ("local-1", "Local lab 1")


def _profiles_80gb(whole_mib: int) -> list:
    """The MIG profiles the A100 80GB and the H100 80GB share; only the whole GPU's differs."""
    return [
        ("1g.10gb", 1, 1, [0, 1, 2, 3, 4, 5, 6], 9984),
        ("1g.20gb", 1, 2, [0, 2, 4, 6], 19968),
        ("2g.20gb", 2, 2, [0, 2, 4], 19968),
        ("3g.40gb", 3, 4, [0, 4], 40192),
        ("4g.40gb", 4, 4, [0], 40192),
        ("7g.80gb", 7, 8, [0], whole_mib),
    ]


# code, name, memory MiB, MIG profiles (name, compute slices, memory slices, starts, MiB)
GPU_MODELS = [
    ("a100-80gb", "NVIDIA A100 80GB", 81920, _profiles_80gb(80896)),
    ("h100-80gb", "NVIDIA H100 80GB", 81559, _profiles_80gb(80384)),
    ("h200-141gb", "NVIDIA H200 141GB", 143771, [
        ("1g.18gb", 1, 1, [0, 1, 2, 3, 4, 5, 6], 17664),
        ("1g.35gb", 1, 2, [0, 2, 4, 6], 33792),
        ("2g.35gb", 2, 2, [0, 2, 4], 33792),
        ("3g.71gb", 3, 4, [0, 4], 70144),
        ("4g.71gb", 4, 4, [0], 70144),
        ("7g.141gb", 7, 8, [0], 143360),
    ]),
    ("l4", "NVIDIA L4", 23034, []),
]  # fmt: skip

# code, GPU model, mode, count, MIG profile, milli, GPU MiB, vCPUs, RAM MiB, disk GiB, $/h
SPECS = [
    ("a100-80gb-x1", "a100-80gb", Mode.WHOLE, 1, None, None, 81920, 12, 131072, 500, "1.8900"),
    ("a100-80gb-x2", "a100-80gb", Mode.WHOLE, 2, None, None, 163840, 24, 262144, 1000, "3.7800"),
    ("a100-80gb-x4", "a100-80gb", Mode.WHOLE, 4, None, None, 327680, 48, 524288, 2000, "7.5600"),
    ("a100-1g.10gb", "a100-80gb", Mode.MIG, 1, "1g.10gb", None, 9984, 2, 16384, 100, "0.2900"),
    ("a100-2g.20gb", "a100-80gb", Mode.MIG, 1, "2g.20gb", None, 19968, 4, 32768, 200, "0.5500"),
    ("a100-3g.40gb", "a100-80gb", Mode.MIG, 1, "3g.40gb", None, 40192, 6, 65536, 250, "0.8500"),
    ("a100-7g.80gb", "a100-80gb", Mode.MIG, 1, "7g.80gb", None, 80896, 12, 131072, 500, "1.7900"),
    ("a100-eighth", "a100-80gb", Mode.SHARED, 1, None, 125, 10240, 2, 16384, 50, "0.2500"),
    ("a100-quarter", "a100-80gb", Mode.SHARED, 1, None, 250, 20480, 3, 32768, 100, "0.4900"),
    ("a100-half", "a100-80gb", Mode.SHARED, 1, None, 500, 40960, 6, 65536, 200, "0.9500"),
    ("h100-80gb-x1", "h100-80gb", Mode.WHOLE, 1, None, None, 81559, 16, 196608, 750, "2.9900"),
    ("h100-80gb-x2", "h100-80gb", Mode.WHOLE, 2, None, None, 163118, 32, 393216, 1500, "5.9800"),
    ("h100-80gb-x4", "h100-80gb", Mode.WHOLE, 4, None, None, 326236, 64, 786432, 3000, "11.9600"),
    ("h100-80gb-x8", "h100-80gb", Mode.WHOLE, 8, None, None, 652472, 128, 1572864, 6000, "23.9200"),
    ("h100-1g.10gb", "h100-80gb", Mode.MIG, 1, "1g.10gb", None, 9984, 2, 24576, 100, "0.4500"),
    ("h100-3g.40gb", "h100-80gb", Mode.MIG, 1, "3g.40gb", None, 40192, 8, 98304, 375, "1.3500"),
    ("h100-quarter", "h100-80gb", Mode.SHARED, 1, None, 250, 20389, 4, 49152, 150, "0.7900"),
    ("h200-141gb-x1", "h200-141gb", Mode.WHOLE, 1, None, None, 143771, 16, 262144, 1000, "3.7900"),
    ("h200-1g.18gb", "h200-141gb", Mode.MIG, 1, "1g.18gb", None, 17664, 2, 32768, 150, "0.5900"),
    ("l4-x1", "l4", Mode.WHOLE, 1, None, None, 23034, 8, 32768, 200, "0.5900"),
    ("l4-half", "l4", Mode.SHARED, 1, None, 500, 11517, 4, 16384, 100, "0.3200"),
]  # fmt: skip

# name, OCI reference, CUDA, description, default command, default env, ports. Only what this
# install obtains without an image registry: make run builds all three into its agents' engine
# (busybox before they start, the others in the background), as `make images` does. The first
# by name (demo-busybox) is what the launch form preselects.
IMAGES: list[tuple] = [
    ("demo-busybox", "localhost/gpucloud/demo:latest", "",
     "A tiny local image for hosts without a registry: busybox serving a web page on 8888 "
     "(make run builds it).", [], {}, [{"port": 8888, "name": "Web page"}]),
    ("jupyterlab", "localhost/gpucloud/jupyter:latest", "",
     "JupyterLab 4.6 and Python 3 on Debian, over /workspace; Open JupyterLab signs you in. "
     "Built on the host from Debian's and PyPI's packages (make run builds it in the "
     "background, or make images).", [], {},
     [{"port": 8888, "name": "JupyterLab", "app": "jupyter"}]),
    ("pytorch", "localhost/gpucloud/pytorch:latest", "",
     "PyTorch 2.13 (its CPU build) and Python 3.11 on Debian. Its command trains a small "
     "network on synthetic data and prints the loss as it falls (the instance's logs), then "
     "stays up for the terminal. Built on the host from Debian's and PyPI's packages (make run "
     "builds it in the background, or make images).", [], {}, []),
]  # fmt: skip
# Images earlier demos offered that need Docker Hub, which a demo's hosts may not reach: seeding
# again retires them (name: the reference they had), so no launch picks them; instances that
# use them keep them. One an operator pointed elsewhere is left alone.
RETIRED_IMAGES = {
    "pytorch-2.5-cuda12.4": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    "vllm-0.6-cuda12.4": "vllm/vllm-openai:v0.6.6",
    "tensorflow-2.17-cuda12.3": "tensorflow/tensorflow:2.17.0-gpu",
    "ubuntu-22.04-cuda12.4": "nvidia/cuda:12.4.1-base-ubuntu22.04",
}

# username, password, staff, memberships (tenant slug, role)
USERS = [
    ("alice", "alice-gpu-demo", False, [("acme", Role.OWNER), ("globex", Role.MEMBER)]),
    ("bob", "bob-gpu-demo", False, [("acme", Role.VIEWER)]),
    ("operator", "operator-gpu-demo", True, []),
]
TENANTS = [
    ("acme", "Acme AI", Decimal("4"), 10, Decimal("500.00")),
    ("globex", "Globex Research", Decimal("1.5"), 4, None),
]


@transaction.atomic
def load_catalog() -> None:
    Region.objects.get_or_create(code=REGION[0], defaults={"name": REGION[1]})
    for code, name, memory, profiles in GPU_MODELS:
        model, _ = GpuModel.objects.get_or_create(
            code=code, defaults={"name": name, "memory_mib": memory, "mig_capable": bool(profiles)}
        )
        for profile, compute, size, starts, mib in profiles:
            MigProfile.objects.get_or_create(
                gpu_model=model,
                name=profile,
                defaults={
                    "compute_slices": compute,
                    "size": size,
                    "starts": starts,
                    "memory_mib": mib,
                },
            )
    for code, model_code, mode, count, profile, milli, mib, vcpus, ram, disk, price in SPECS:
        model = GpuModel.objects.get(code=model_code)
        spec = Spec.objects.filter(code=code).first()
        if spec is None:
            spec = Spec(
                code=code,
                name=_spec_name(model, mode, count, profile, milli),
                gpu_model=model,
                mode=mode,
                gpu_count=count,
                mig_profile=MigProfile.objects.get(gpu_model=model, name=profile)
                if profile
                else None,
                milli=milli,
                gpu_memory_mib=mib,
                vcpus=vcpus,
                ram_mib=ram,
                disk_gib=disk,
                price_per_hour=Decimal(price),
            )
            spec.full_clean()
            spec.save()  # with its first price point
    for name, reference, cuda, description, command, env, ports in IMAGES:
        Image.objects.get_or_create(
            name=name,
            defaults={
                "reference": reference,
                "cuda_version": cuda,
                "description": description,
                "command": command,
                "env": env,
                "ports": ports,
            },
        )
    for name, reference in RETIRED_IMAGES.items():
        Image.objects.filter(name=name, reference=reference, active=True).update(active=False)


def _spec_name(model: GpuModel, mode: str, count: int, profile: str | None, milli: int | None):
    short = model.name.removeprefix("NVIDIA ")
    if mode == Mode.WHOLE:
        return f"{count}× {short}"
    if mode == Mode.MIG:
        return f"{short} MIG {profile}"
    fraction = {125: "1/8", 250: "1/4", 500: "1/2"}.get(milli, f"{milli}/1000")
    return f"{fraction} {short} (shared)"


@transaction.atomic
def load_tenants() -> None:
    for slug, name, gpu_quota, max_instances, budget in TENANTS:
        if not Tenant.objects.filter(slug=slug).exists():
            services.create_tenant(slug, name, gpu_quota, max_instances, budget)
    User = get_user_model()
    for username, password, staff, memberships in USERS:
        if not User.objects.filter(username=username).exists():
            services.ensure_user(
                username,
                password=password,
                email=f"{username}@example.com",
                is_staff=staff,
                is_superuser=staff,
            )
        user = User.objects.get(username=username)
        for slug, role in memberships:
            tenant = Tenant.objects.get(slug=slug)
            if not Membership.objects.filter(user=user, tenant=tenant).exists():
                services.add_member(tenant, user, role)


def load() -> None:
    load_catalog()
    load_tenants()
