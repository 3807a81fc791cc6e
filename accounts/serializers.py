from rest_framework import serializers


class QuotaSerializer(serializers.Serializer):
    gpu_quota = serializers.DecimalField(max_digits=8, decimal_places=3, normalize_output=True)
    gpu_used = serializers.DecimalField(max_digits=8, decimal_places=3, normalize_output=True)
    max_instances = serializers.IntegerField()
    instances_used = serializers.IntegerField()
    monthly_budget = serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True)
    budget_action = serializers.CharField()
