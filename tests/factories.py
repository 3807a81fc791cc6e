from decimal import Decimal

import factory
from django.contrib.auth import get_user_model

from accounts.models import Membership, Quota, Tenant
from accounts.roles import Role
from console.catalog.models import GpuModel, Image, MigProfile, Mode, Region, Spec


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("correct-horse-battery")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ["slug"]
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")
    quota = factory.RelatedFactory("tests.factories.QuotaFactory", factory_related_name="tenant")


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    gpu_quota = Decimal("2")
    max_instances = 5


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.MEMBER


class RegionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Region
        django_get_or_create = ["code"]

    code = "local-1"
    name = "Local 1"


class GpuModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuModel
        django_get_or_create = ["code"]

    code = "a100-80gb"
    name = "NVIDIA A100 80GB"
    memory_mib = 81920
    mig_capable = True


A100_PROFILES = [
    ("1g.10gb", 1, 1, [0, 1, 2, 3, 4, 5, 6], 9984),
    ("1g.20gb", 1, 2, [0, 2, 4, 6], 19968),
    ("2g.20gb", 2, 2, [0, 2, 4], 19968),
    ("3g.40gb", 3, 4, [0, 4], 40192),
    ("4g.40gb", 4, 4, [0], 40192),
    ("7g.80gb", 7, 8, [0], 80896),
]


def mig_profile(gpu_model: GpuModel, name: str) -> MigProfile:
    _, compute, size, starts, memory = next(p for p in A100_PROFILES if p[0] == name)
    profile, _ = MigProfile.objects.get_or_create(
        gpu_model=gpu_model,
        name=name,
        defaults={"compute_slices": compute, "size": size, "starts": starts, "memory_mib": memory},
    )
    return profile


class ImageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Image
        django_get_or_create = ["name"]

    name = "pytorch-2.5-cuda12.4"
    reference = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    cuda_version = "12.4"


class SpecFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Spec
        django_get_or_create = ["code"]

    code = factory.Sequence(lambda n: f"spec-{n}")
    name = factory.LazyAttribute(lambda s: s.code)
    gpu_model = factory.SubFactory(GpuModelFactory)
    mode = Mode.SHARED
    gpu_count = 1
    milli = 250
    gpu_memory_mib = 20480
    vcpus = 4
    ram_mib = 16384
    disk_gib = 50
    price_per_hour = Decimal("0.9000")
