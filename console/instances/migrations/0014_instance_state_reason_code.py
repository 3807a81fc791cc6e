"""An instance's state reason in two columns, a code and its detail, instead of one line
("code: detail") that was parsed back with a regex: the rows so far are split once, here."""

import re

from django.db import migrations, models

# The codes there were when the reason was one line, and how that line was read.
CODES = {
    "exited",
    "exit_code",
    "exit_status_unknown",
    "oom_killed",
    "gpu_memory_cap",
    "container_lost",
    "command_not_found",
    "image_not_found",
    "image_pull_failed",
    "launch_failed",
    "engine_unavailable",
    "disk_failed",
    "volume_foreign",
    "volume_busy",
    "gpu_lost",
    "gpu_missing",
    "mig_device_missing",
    "agent_restarted",
    "allocation_lost",
    "allocation_vanished",
    "agent_reported",
    "agent_unavailable",
    "agent_rejected",
    "internal_error",
    "host_unreachable",
    "host_lost",
    "budget_stopped",
    "idle_stopped",
    "runtime_limit",
}
CODED = re.compile(r"(?P<code>[a-z]+(?:_[a-z]+)*)(?:: ?(?P<detail>.*))?", re.DOTALL)
EXIT_CODE = re.compile(r"exit code (?P<detail>-?[0-9]+)")


def split(text: str) -> tuple[str, str]:
    """(code, detail) of a reason line: "code", "code: detail", "exit code 3", or words (no
    code)."""
    if found := EXIT_CODE.fullmatch(text):
        return "exit_code", found["detail"]
    found = CODED.fullmatch(text)
    if found and found["code"] in CODES:
        return found["code"], found["detail"] or ""
    return "", text


def joined(code: str, detail: str) -> str:
    """The reason line again (reasons.Reason.text)."""
    if code == "exit_code":
        return f"exit code {detail}"
    if code and detail:
        return f"{code}: {detail}"
    return code or detail


def split_reasons(apps, schema_editor):
    Instance = apps.get_model("instances", "Instance")
    for pk, text in Instance.objects.exclude(state_reason="").values_list("pk", "state_reason"):
        code, detail = split(text)
        Instance.objects.filter(pk=pk).update(state_reason_code=code, state_reason_detail=detail)


def join_reasons(apps, schema_editor):
    Instance = apps.get_model("instances", "Instance")
    rows = Instance.objects.values_list("pk", "state_reason_code", "state_reason_detail")
    for pk, code, detail in rows:
        if code or detail:
            Instance.objects.filter(pk=pk).update(state_reason=joined(code, detail)[:200])


class Migration(migrations.Migration):
    dependencies = [
        ("instances", "0013_event_continues_run_shelved"),
    ]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="state_reason_code",
            field=models.CharField(
                blank=True,
                choices=[
                    ("exited", "Exited"),
                    ("exit_code", "Exit Code"),
                    ("exit_status_unknown", "Exit Status Unknown"),
                    ("oom_killed", "Oom Killed"),
                    ("gpu_memory_cap", "Gpu Memory Cap"),
                    ("container_lost", "Container Lost"),
                    ("command_not_found", "Command Not Found"),
                    ("image_not_found", "Image Not Found"),
                    ("image_pull_failed", "Image Pull Failed"),
                    ("launch_failed", "Launch Failed"),
                    ("engine_unavailable", "Engine Unavailable"),
                    ("disk_failed", "Disk Failed"),
                    ("volume_foreign", "Volume Foreign"),
                    ("volume_busy", "Volume Busy"),
                    ("gpu_lost", "Gpu Lost"),
                    ("gpu_missing", "Gpu Missing"),
                    ("mig_device_missing", "Mig Device Missing"),
                    ("agent_restarted", "Agent Restarted"),
                    ("allocation_lost", "Allocation Lost"),
                    ("allocation_vanished", "Allocation Vanished"),
                    ("agent_reported", "Agent Reported"),
                    ("agent_unavailable", "Agent Unavailable"),
                    ("agent_rejected", "Agent Rejected"),
                    ("internal_error", "Internal Error"),
                    ("host_unreachable", "Host Unreachable"),
                    ("host_lost", "Host Lost"),
                    ("budget_stopped", "Budget Stopped"),
                    ("idle_stopped", "Idle Stopped"),
                    ("runtime_limit", "Runtime Limit"),
                ],
                max_length=32,
            ),
        ),
        migrations.AddField(
            model_name="instance",
            name="state_reason_detail",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.RunPython(split_reasons, join_reasons),
        migrations.RemoveField(
            model_name="instance",
            name="state_reason",
        ),
    ]
