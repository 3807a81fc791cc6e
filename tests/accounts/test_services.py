from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken, Membership, Quota, Tenant
from accounts.roles import Role


@pytest.mark.django_db
class TestCreateTenant:
    def test_creates_tenant_and_quota(self):
        tenant = services.create_tenant(
            "deep-labs", "Deep Labs", Decimal("1.5"), 3, Decimal("99.99")
        )
        assert tenant.quota.gpu_quota == Decimal("1.5")
        assert tenant.quota.max_instances == 3
        assert tenant.quota.monthly_budget == Decimal("99.99")

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"gpu_quota": Decimal("-1")}, "gpu_quota"),
            ({"gpu_quota": Decimal("1.2345")}, "gpu_quota"),
            ({"monthly_budget": Decimal("10.001")}, "monthly_budget"),
            ({"monthly_budget": Decimal("-5")}, "monthly_budget"),
        ],
    )
    def test_bad_quota_writes_nothing(self, kwargs, field):
        with pytest.raises(ValidationError) as error:
            services.create_tenant("bad", **kwargs)
        assert field in error.value.message_dict
        assert not Tenant.objects.filter(slug="bad").exists()
        assert not Quota.objects.exists()

    def test_duplicate_slug_refused(self):
        services.create_tenant("acme")
        with pytest.raises(ValidationError) as error:
            services.create_tenant("acme")
        assert "slug" in error.value.message_dict
        assert Tenant.objects.count() == 1

    def test_bad_slug_refused(self):
        with pytest.raises(ValidationError):
            services.create_tenant("Not A Slug!")


@pytest.mark.django_db
class TestMemberships:
    def test_unknown_role_refused(self, tenant, make_member):
        membership = make_member(tenant, Role.MEMBER)
        with pytest.raises(ValidationError):
            services.change_role(membership, "superuser")
        membership.refresh_from_db()
        assert membership.role == Role.MEMBER

    def test_last_owner_cannot_be_demoted_or_removed(self, tenant, make_member):
        owner = make_member(tenant, Role.OWNER)
        with pytest.raises(ValidationError):
            services.change_role(owner, Role.ADMIN)
        with pytest.raises(ValidationError):
            services.remove_member(owner)
        owner.refresh_from_db()
        assert owner.role == Role.OWNER

    def test_an_owner_can_leave_when_another_remains(self, tenant, make_member):
        first = make_member(tenant, Role.OWNER)
        make_member(tenant, Role.OWNER)
        services.remove_member(first)
        assert Membership.objects.filter(tenant=tenant, role=Role.OWNER).count() == 1

    def test_removing_a_member_revokes_their_tokens(self, tenant, make_member):
        member = make_member(tenant, Role.ADMIN)
        issued = services.issue_token(member.user, tenant, "laptop")
        services.remove_member(member)
        issued.token.refresh_from_db()
        assert issued.token.is_revoked

    def test_add_twice_refused(self, tenant, make_member):
        member = make_member(tenant, Role.MEMBER)
        with pytest.raises(ValidationError):
            services.add_member(tenant, member.user, Role.VIEWER)


@pytest.mark.django_db
@pytest.mark.usefixtures("prepared_queries")
class TestTokens:
    def test_raw_token_is_not_stored(self, tenant, make_member):
        member = make_member(tenant)
        issued = services.issue_token(member.user, tenant, "ci")
        token = ApiToken.objects.get()
        assert issued.raw.startswith(f"gpc_{token.prefix}_")
        assert issued.raw not in (token.token_hash, token.prefix)

    def test_authenticates_and_records_last_use(self, tenant, make_member):
        member = make_member(tenant)
        issued = services.issue_token(member.user, tenant, "ci")
        token, membership = services.authenticate_token(issued.raw)
        assert membership == member
        token.refresh_from_db()
        assert token.last_used_at is not None

    @pytest.mark.parametrize("raw", ["", "nonsense", "gpc_short_x", "gpc_deadbeef_wrongsecret"])
    def test_malformed_or_unknown(self, raw):
        with pytest.raises(services.TokenRejected) as error:
            services.authenticate_token(raw)
        assert error.value.code == "invalid_token"

    def test_right_prefix_wrong_secret(self, tenant, make_member):
        issued = services.issue_token(make_member(tenant).user, tenant, "ci")
        with pytest.raises(services.TokenRejected):
            services.authenticate_token(issued.raw[:-2] + "xx")

    def test_revoked_expired_suspended(self, tenant, make_member):
        member = make_member(tenant)
        revoked = services.issue_token(member.user, tenant, "a")
        services.revoke_token(revoked.token)
        expiring = services.issue_token(
            member.user, tenant, "b", expires_at=timezone.now() + timedelta(seconds=1)
        )
        ApiToken.objects.filter(pk=expiring.token.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        live = services.issue_token(member.user, tenant, "c")
        services.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
        for issued, code in [
            (revoked, "token_revoked"),
            (expiring, "token_expired"),
            (live, "tenant_suspended"),
        ]:
            with pytest.raises(services.TokenRejected) as error:
                services.authenticate_token(issued.raw)
            assert error.value.code == code

    def test_expiry_in_the_past_refused(self, tenant, make_member):
        with pytest.raises(ValidationError):
            services.issue_token(
                make_member(tenant).user, tenant, "x", expires_at=timezone.now() - timedelta(days=1)
            )

    def test_non_member_cannot_get_a_token(self, tenant, other_tenant, make_member):
        member = make_member(tenant)
        with pytest.raises(ValidationError):
            services.issue_token(member.user, other_tenant, "sneaky")
