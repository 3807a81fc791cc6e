"""The token of an app that signs in with one (a port with "app": "jupyter"): one per instance,
in every allocation's environment (stop and start keep it), in no other instance's, and the
sign-in query of its port."""

import pytest

from console.catalog.models import Mode, port_errors
from console.instances import outcomes, services, sign_in
from console.instances.models import Instance

pytestmark = pytest.mark.usefixtures("no_tasks")
JUPYTER = [{"port": 8888, "name": "JupyterLab", "app": "jupyter"}]


def launch(catalog, tenant, name):
    return services.launch_instance(
        tenant, name=name, spec=catalog.quarter, image=catalog.image, env={"SEED": "7"}
    )


def test_a_jupyter_image_gets_the_instances_token_through_stop_and_start(catalog, tenant):
    catalog.image.ports = JUPYTER
    catalog.image.save()
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance, other = launch(catalog, tenant, "nb"), launch(catalog, tenant, "nb2")
    first = instance.current_allocation()
    assert first.request["env"] == {"SEED": "7", "JUPYTER_TOKEN": instance.app_token}
    assert len(instance.app_token) >= 40 and other.app_token != instance.app_token

    outcomes.mark_running(instance.pk, first.pk)
    services.stop_instance(Instance.objects.get(pk=instance.pk))
    assert outcomes.finish_stop(instance.pk)
    services.start_instance(Instance.objects.get(pk=instance.pk))
    second = Instance.objects.get(pk=instance.pk).current_allocation()
    assert second.pk != first.pk
    assert second.request["env"]["JUPYTER_TOKEN"] == instance.app_token


def test_an_image_without_a_jupyter_port_gets_no_token(catalog, tenant):
    catalog.image.ports = [{"port": 8888, "name": "Web page"}]
    catalog.image.save()
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = launch(catalog, tenant, "web")
    assert instance.current_allocation().request["env"] == {"SEED": "7"}


def test_the_sign_in_query_of_a_port():
    assert sign_in.app_query(JUPYTER[0], "a+b/c") == "token=a%2Bb%2Fc"
    assert sign_in.app_query({"port": 8080, "name": "app"}, "secret") == ""


@pytest.mark.parametrize(
    ("ports", "problem"),
    [
        (JUPYTER, None),
        ([{"port": 8888, "name": "x", "app": "vscode"}], "'vscode': the app is one of jupyter."),
        ([{"port": 8888, "name": "x", "token": "y"}], 'may add "app": "jupyter"'),
    ],
)
def test_a_port_may_say_it_is_jupyter(ports, problem):
    errors = port_errors(ports)
    assert (problem in errors[0]) if problem else errors == []


def test_a_tenant_cannot_set_the_token(catalog, member, token_client):
    body = {"name": "nb", "spec": "a100-quarter", "image": catalog.image.name}
    answer = token_client(member).post(
        "/api/v1/instances/", {**body, "env": {"JUPYTER_TOKEN": "mine"}}, format="json"
    )
    assert answer.status_code == 400
    assert "JUPYTER_TOKEN is the platform's" in answer.json()["errors"]["env"][0]
