"""Metric history: one row per series and minute with the min, mean and max of each metric.

The live window (console.metrics.live) keeps the last minutes at full rate; the downsampler
(console.metrics.history) folds each finished minute into a row here, kept
settings.METRICS_HISTORY_DAYS days."""

from django.db import models

from console.fleet.models import Host
from console.instances.models import Instance

# The metrics a row summarises, in the order the live window stores them.
METRICS = ("gpu_util", "mem_used_mib", "temperature_c", "power_w")


class MetricMinute(models.Model):
    """One minute of one series.

    Series are named like the live window names them: `instance:<id>` (what an instance's
    slice did, as its allocation's samples say), `gpu:<host id>:<index>` (a physical GPU) and
    `mig:<host id>:<index>:<MIG uuid>` (a MIG device)."""

    series = models.CharField(max_length=160)
    minute = models.DateTimeField(help_text="start of the minute, UTC")
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    host = models.ForeignKey(
        Host, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    samples = models.PositiveIntegerField(help_text="samples read in the minute")

    gpu_util_min = models.FloatField(null=True)
    gpu_util_mean = models.FloatField(null=True)
    gpu_util_max = models.FloatField(null=True)
    mem_used_mib_min = models.FloatField(null=True)
    mem_used_mib_mean = models.FloatField(null=True)
    mem_used_mib_max = models.FloatField(null=True)
    mem_total_mib = models.FloatField(null=True, help_text="the largest total seen")
    temperature_c_min = models.FloatField(null=True)
    temperature_c_mean = models.FloatField(null=True)
    temperature_c_max = models.FloatField(null=True)
    power_w_min = models.FloatField(null=True)
    power_w_mean = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)

    class Meta:
        ordering = ["series", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["series", "minute"], name="one_row_per_series_minute")
        ]
        indexes = [models.Index(fields=["minute"], name="metricminute_minute")]

    def __str__(self) -> str:
        return f"{self.series} @ {self.minute:%Y-%m-%d %H:%M}"
