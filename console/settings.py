"""Settings for gpucloud. Everything comes from the environment; the defaults run a fresh clone
as-is (embedded: SQLite, in-process layers). See README.md for the variables."""

import os
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.http import is_same_domain

from console import state_dir
from console.env import env_bool, env_decimal, env_float, env_int, env_list, env_networks, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
# var/ holds the database, sessions, the secret key and logs: the console's user only. Reading
# these settings makes nothing there: the entry points make it first (console/state_dir.py).
VAR_DIR = state_dir.var_dir()

# Django refuses an empty SECRET_KEY where it is used: a process that did not make its state
# directory first (console.state_dir.prepare) fails then rather than sign with nothing.
SECRET_KEY = env_str("SECRET_KEY") or state_dir.stored_secret("secret-key")
# Seals tenants' secret env values (console/secret_env.py); empty: a key derived
# from SECRET_KEY. Either, and SECRET_KEY_FALLBACKS, still open what they sealed.
SECRET_ENV_KEY = env_str("SECRET_ENV_KEY")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

# Served over HTTPS (HTTPS=true): redirect plain HTTP, HSTS, cookies sent over HTTPS only;
# each can be set on its own. Behind TRUSTED_PROXY_COUNT proxies, their X-Forwarded-Proto
# says whether the request came over HTTPS.
HTTPS = env_bool("HTTPS", False)
_PRODUCTION_HTTPS = HTTPS and not DEBUG
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _PRODUCTION_HTTPS)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 86400 if _PRODUCTION_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", _PRODUCTION_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", _PRODUCTION_HTTPS)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", HTTPS)
if env_int("TRUSTED_PROXY_COUNT", 0):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Secure cookies get the `__Host-` prefix: host-only, so that no other host of the domain (an
# instance's port origin) can set one for the console.
SESSION_COOKIE_NAME = "__Host-sessionid" if SESSION_COOKIE_SECURE else "sessionid"
CSRF_COOKIE_NAME = "__Host-csrftoken" if CSRF_COOKIE_SECURE else "csrftoken"

# Instances' web ports are served on origins of their own, i{id}-{port}.PORTS_DOMAIN (a wildcard
# name and certificate; `*.localhost` is loopback in browsers), on the console's port unless
# PORTS_DOMAIN names one (console/instances/port_origin.py). CONSOLE_URL is where their pages
# link back to: by default the first ALLOWED_HOSTS name, on their own scheme and port.
PORTS_DOMAIN = env_str("PORTS_DOMAIN", "ports.localhost")
CONSOLE_URL = env_str("CONSOLE_URL")
_A_PORT_HOST = "i1-1." + PORTS_DOMAIN.partition(":")[0].lower()
if any(pattern == "*" or is_same_domain(_A_PORT_HOST, pattern) for pattern in ALLOWED_HOSTS):
    raise ImproperlyConfigured(
        f"ALLOWED_HOSTS covers the ports' hosts (*.{PORTS_DOMAIN}): the console's websockets "
        "would take their pages' Origin. Name the console's hosts only."
    )
if any(
    is_same_domain(_A_PORT_HOST, (urlsplit(origin).hostname or "").lstrip("*"))
    for origin in CSRF_TRUSTED_ORIGINS
):
    raise ImproperlyConfigured(
        f"CSRF_TRUSTED_ORIGINS covers the ports' hosts (*.{PORTS_DOMAIN}): their pages could "
        "post to the console."
    )
# The healthcheck answers over plain HTTP too (load balancers probe it so), and so do the
# agents' endpoints: without a balancer, agents call the web processes themselves, which serve
# plain HTTP inside the network as the agents' own APIs do (each call carries its host's secret).
SECURE_REDIRECT_EXEMPT = [r"^healthz\Z", r"^agent/"]

# Content-Security-Policy (django-csp): scripts, styles, images and sockets from this site
# only; no inline script (templates use data-* attributes and static/js instead).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        # Plotly and the meters set style attributes; no script can be injected through them.
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "accounts",
    "console.catalog",
    "console.fleet",
    "console.instances",
    "console.launch_templates",
    "console.registry_credentials",
    "console.metrics",
    "console.web",
    "console.volumes",
    "console.snapshots",
    "console.notifications",
    "console.audit",
    "console.idle",
    "billing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "console.health.serve_regardless_of_host",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "accounts.middleware.CurrentTenantMiddleware",
    "console.audit.middleware.AuditActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
# Django requests a web process runs at once, each in a thread of its own (console/asgi.py); the
# others wait in the event loop. More threads than a few only take turns at the process's one
# interpreter, and each turn costs CPU: 20 clients' lists cost 24.6 ms of CPU each, 20.3 ms with
# 4 at once.
WEB_REQUEST_CONCURRENCY = env_int("WEB_REQUEST_CONCURRENCY", 4)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.tenancy",
                "billing.context_processors.budget_notices",
                "console.web.image_builds.image_builds",
            ],
        },
    },
]

# Database: PostgreSQL from DATABASE_URL, else an embedded SQLite file. SQLite runs in WAL mode
# with IMMEDIATE transactions so that concurrent writers (web, worker, beat) serialise instead of
# failing, which is also what makes quota checks atomic there.
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # A pool per process, which a request's connection goes back to when it ends: whatever
    # threads ask (web requests, websockets, Celery), a process holds DATABASE_POOL_SIZE at most.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env_int("DATABASE_POOL_SIZE", 10),
    }
    # Values bound on the server, and a statement a pooled connection has run 5 times prepared
    # there: PostgreSQL then plans the API's queries once per connection, not on every request
    # (its CPU under 20 clients' lists: 0.42-0.45 -> 0.29-0.30 cores, bench/api.py). Restart the
    # console's processes after a migration, as an upgrade does: their prepared statements
    # hold the tables' old columns. Not for PgBouncer in transaction mode.
    DATABASES["default"]["OPTIONS"].setdefault("server_side_binding", True)
    DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 5)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            # made 0600 by console.state_dir.prepare before SQLite opens it
            "NAME": state_dir.sqlite_path(),
            # Kept for the thread's next request: a web process runs requests in a fixed set of
            # threads (console/asgi.py), and a new connection reads the schema, prepares its
            # statements and registers Django's functions all over again.
            "CONN_MAX_AGE": None,
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file (not memory) so that the processes integration tests start can open it;
            # one per test run so that runs side by side do not share it.
            "TEST": {"NAME": str(VAR_DIR / f"test-gpucloud-{os.getpid()}.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Every API request's token check and the instances' lists run SQL compiled once per shape of
# their filters (console/speedups/prepared.py), through Django's private compiler API. Off, they
# run as plain querysets, with the same answers: for a Django upgrade that changed that API.
PREPARED_QUERIES = env_bool("PREPARED_QUERIES", True)

# Redis carries the Celery broker, the Channels layer and the live cache. Without REDIS_URL
# everything stays in-process (a single process: tests and `manage.py` one-offs); `make run`
# starts an embedded Redis-protocol server and hands its URL to every process it starts.
REDIS_URL = env_str("REDIS_URL")

# Everything a deployment keeps in Redis is named under DEPLOYMENT_NAME: its channel layer's
# pub/sub channels, its cache's and live window's keys, its broker's queues. Two deployments
# (staging and production) may so share one Redis server: a database number in REDIS_URL would
# not keep them apart, as Redis pub/sub ignores database numbers. Every process of a deployment
# (web, worker, beat) must have the same name.
_DEPLOYMENT_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,49}"


def _deployment_name() -> str:
    """DEPLOYMENT_NAME, else the PostgreSQL database's name (deployments have databases of
    their own, most often named apart), else "gpucloud"."""
    name = env_str("DEPLOYMENT_NAME")
    if name:
        if not re.fullmatch(_DEPLOYMENT_NAME_PATTERN, name):
            raise ImproperlyConfigured(
                f"DEPLOYMENT_NAME {name!r}: 1-50 letters, digits, '_', '-' or '.', starting "
                "with a letter or digit."
            )
        return name
    database = DATABASES["default"]["NAME"] if DATABASE_URL else ""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", database).lstrip("_.-")[:50] or "gpucloud"


DEPLOYMENT_NAME = _deployment_name()
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # Groups publish on `<prefix>__group__<group>`, consumers on `<prefix>specific.<id>`;
            # a valid channel name, hence the dots.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"{DEPLOYMENT_NAME}.asgi."},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "console.speedups.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": DEPLOYMENT_NAME,
        }
    }
    CELERY_BROKER_URL = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CELERY_BROKER_URL = "memory://"
# No worker reads an in-memory broker: queuing a task to it is refused (console/celery.py)
# except where this is set, as the tests set it.
ALLOW_IN_MEMORY_BROKER = env_bool("ALLOW_IN_MEMORY_BROKER", False)

CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task a dead worker had taken (acks_late) goes back to the queue CELERY_VISIBILITY_TIMEOUT
# seconds after it was taken. It must outlast the longest a live worker holds one: a retry's
# countdown (up to INSTANCE_AGENT_RETRY_BACKOFF_MAX) plus the task's own run (a few agent calls
# of AGENT_TIMEOUT_SECONDS), else a held task is delivered twice and its retries multiply.
# A launch does not wait for it: reconcile re-drives one whose allocation its agent does not
# hold (LAUNCH_REDRIVE_SECONDS).
CELERY_VISIBILITY_TIMEOUT = env_int("CELERY_VISIBILITY_TIMEOUT", 120)
# On Redis, every key and pub/sub channel of the broker starts with this deployment's name.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
    "global_keyprefix": f"{DEPLOYMENT_NAME}:celery:",
}
CELERY_TIMEZONE = "UTC"
# `celery beat`'s state (when each entry last ran) lives with the rest of the state, in
# GPUCLOUD_VAR_DIR, not in the directory it was started from.
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# One beat at a time sends the periodic tasks: it holds a lock in Redis, renewed while it runs
# (console/beat.py); another beat waits, and takes over at most BEAT_LOCK_SECONDS and a second
# after the holder dies.
CELERY_BEAT_SCHEDULER = "console.beat:LockedScheduler"
BEAT_LOCK_SECONDS = env_float("BEAT_LOCK_SECONDS", 20.0)
CELERY_TASK_ROUTES = {
    "console.instances.tasks.schedule_pending": {"queue": "default"},
    "console.instances.tasks.*": {"queue": "provisioning"},
    "billing.tasks.*": {"queue": "billing"},
    "console.metrics.tasks.*": {"queue": "metrics"},
}
CELERY_BEAT_SCHEDULE = {
    "fleet-watchdog": {"task": "console.fleet.tasks.watchdog", "schedule": 5.0},
    "fleet-image-settings": {
        "task": "console.fleet.tasks.push_due_image_settings",
        "schedule": 60.0,
    },
    "fleet-certify-gateways": {
        "task": "console.fleet.tasks.certify_due_gateways",
        "schedule": 60.0,
    },
    "fleet-rotate-host-secrets": {
        "task": "console.fleet.tasks.rotate_due_host_secrets",
        "schedule": 3600.0,
    },
    "instances-schedule-pending": {
        "task": "console.instances.tasks.schedule_pending",
        "schedule": 5.0,
    },
    "instances-reconcile": {
        "task": "console.instances.tasks.reconcile",
        "schedule": env_float("RECONCILE_INTERVAL_SECONDS", 10.0),
    },
    "metrics-downsample": {"task": "console.metrics.tasks.downsample", "schedule": 60.0},
    "billing-meter": {"task": "billing.tasks.meter", "schedule": 60.0},
    # the idle policies' watch (console.idle): warn, then stop what is idle
    "idle-evaluate": {
        "task": "console.idle.tasks.evaluate",
        "schedule": env_float("IDLE_CHECK_SECONDS", 30.0),
    },
    "billing-finalize": {"task": "billing.tasks.finalize_invoices", "schedule": 3600.0},
    "snapshots-schedules": {
        "task": "console.snapshots.tasks.run_schedules",
        "schedule": env_float("SNAPSHOT_SCHEDULES_SECONDS", 60.0),
    },
    "notifications-sweep": {
        "task": "console.notifications.tasks.sweep",
        "schedule": env_float("NOTIFICATIONS_SWEEP_SECONDS", 10.0),
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Sign-in throttling (django-axes): after LOGIN_FAILURE_LIMIT wrong passwords for one username,
# or from one address, sign-ins from there are refused (429, Retry-After) for
# LOGIN_LOCKOUT_MINUTES, before any password is hashed. Console and admin logins alike. The
# address is REMOTE_ADDR, or behind TRUSTED_PROXY_COUNT proxies the one they put in
# X-Forwarded-For.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "accounts.guards.login_locked_out"
AXES_CLIENT_IP_CALLABLE = "accounts.authentication.client_address"
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
# `manage.py collectstatic` (`make run` and every deployment run it before the server) writes each
# file under a name with its content's hash, gzip and brotli copies and a manifest to STATIC_ROOT;
# pages link the hashed names and whitenoise serves them compressed with a year's cache.
# STATIC_COLLECTED=false serves static/ as it is (plain names, a minute's cache): the tests, which
# never collect, run so (pyproject.toml sets it for pytest).
STATIC_COLLECTED = env_bool("STATIC_COLLECTED", True)
if STATIC_COLLECTED:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "console.staticfiles.CompressedManifestStorage"},
    }
else:
    WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.BearerTokenAuthentication",
        "accounts.authentication.TenantSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.permissions.TenantRole"],
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
    # Unknown bearer tokens per client address before it is refused (accounts.authentication).
    "DEFAULT_THROTTLE_RATES": {"bad_token": env_str("API_BAD_TOKEN_RATE", "10/min")},
    "NUM_PROXIES": env_int("TRUSTED_PROXY_COUNT", 0),
    "DEFAULT_RENDERER_CLASSES": [
        "console.api.renderers.FastJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpucloud API",
    "DESCRIPTION": "Rent whole GPUs, MIG slices and GPU fractions; pay per second.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "InstanceStateEnum": "console.instances.models.State",
        "KindEnum": "billing.models.Invoice.Kind",
        "SnapshotStateEnum": "console.snapshots.models.Progress.State",
        "SnapshotKindEnum": "console.snapshots.models.Snapshot.Kind",
        "ShelfStateEnum": "console.snapshots.models.Shelf.State",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.api.schema.add_error_responses",
        "console.api.schema.add_token_scopes",
    ],
}

# One stream for every process (web, worker, beat): LOG_LEVEL, and LOG_FORMAT=json for one JSON
# object per line. Workers log a line when a task is received (what a killed worker had in
# hand) and one per outcome ("succeeded in", "retry", "raised"); see console.logs for the
# access log.
LOG_FORMAT = env_str("LOG_FORMAT", "text")
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT is text or json, not {LOG_FORMAT!r}.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "console.logs.JsonFormatter"},
    },
    "filters": {"routine_tasks": {"()": "console.logs.RoutineTasksAtDebug"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # the beat's periodic tasks' "received" and "succeeded" lines at DEBUG (console.logs)
        "celery.worker.strategy": {"filters": ["routine_tasks"]},
        "celery.app.trace": {"filters": ["routine_tasks"]},
        # a worker's start, "ready." and shutdown lines, whatever LOG_LEVEL says: supervisors,
        # the tests' and the benchmarks' harness wait for "ready."
        "celery.apps.worker": {"level": "INFO"},
    },
}

# Mail (budget alerts, invitations, notifications): the operator's SMTP server when EMAIL_HOST
# is set, else printed to the worker's log (console backend); EMAIL_BACKEND chooses another,
# e.g. django.core.mail.backends.filebased.EmailBackend into EMAIL_FILE_PATH.
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_PORT = env_int("EMAIL_PORT", 587)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", EMAIL_PORT == 587)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", EMAIL_PORT == 465)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "billing@gpucloud.local")
# How long the link of an invitation to a tenant (accounts.invitations) stays valid.
INVITATION_VALID_DAYS = env_int("INVITATION_VALID_DAYS", 7)

# Notifications (console.notifications): webhooks and Slack-compatible hooks reach public
# https:// addresses only; NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES=true lets loopback, private
# addresses and plain http through (tests, `make run`; never a deployment). A failed delivery
# is tried again after NOTIFICATIONS_RETRY_SECONDS, doubling up to
# NOTIFICATIONS_RETRY_MAX_SECONDS, for NOTIFICATIONS_RETRY_HOURS; a rotated webhook secret
# keeps signing for NOTIFICATIONS_SECRET_GRACE_HOURS.
NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = env_bool("NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES", False)
NOTIFICATIONS_TIMEOUT_SECONDS = env_float("NOTIFICATIONS_TIMEOUT_SECONDS", 10.0)
NOTIFICATIONS_RETRY_SECONDS = env_float("NOTIFICATIONS_RETRY_SECONDS", 30.0)
NOTIFICATIONS_RETRY_MAX_SECONDS = env_float("NOTIFICATIONS_RETRY_MAX_SECONDS", 3600.0)
NOTIFICATIONS_RETRY_HOURS = env_float("NOTIFICATIONS_RETRY_HOURS", 24.0)
NOTIFICATIONS_SECRET_GRACE_HOURS = env_float("NOTIFICATIONS_SECRET_GRACE_HOURS", 24.0)

# Fleet
HOST_HEARTBEAT_GRACE_SECONDS = env_float("HOST_HEARTBEAT_GRACE_SECONDS", 15.0)
# A host unreachable this long is lost: its instances (`unreachable` meanwhile, and adopted
# back if it returns sooner) fail over. Minutes, so that an agent's upgrade or restart keeps
# its workloads.
HOST_FAILOVER_SECONDS = env_float("HOST_FAILOVER_SECONDS", 300.0)
# Hosts that stop being heard within one grace period of each other, this share of the fleet
# or more (and at least two), are not failed over: the console's own outage, most likely.
HOST_FAILOVER_SILENT_SHARE = env_float("HOST_FAILOVER_SILENT_SHARE", 1.0)
AGENT_TIMEOUT_SECONDS = env_float("AGENT_TIMEOUT_SECONDS", 5.0)
# Where host agents may be: the address an agent advertises must resolve into these networks
# (link-local and cloud metadata addresses are refused whatever this says).
AGENT_ALLOWED_NETWORKS = env_networks(
    "AGENT_ALLOWED_NETWORKS",
    "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7",
)
# Never an agent's address, whatever AGENT_ALLOWED_NETWORKS says, beside the subnets the agents
# report for their containers: ranges an engine may give containers that no agent reported yet
# (an engine's address pools, if the operator set them).
AGENT_REFUSED_NETWORKS = env_networks("AGENT_REFUSED_NETWORKS", "")
JOIN_TOKEN_TTL_HOURS = env_int("JOIN_TOKEN_TTL_HOURS", 24)
# A host's secret is rotated this often (0: only on demand); the one it replaces stays valid
# this long on both sides, for the calls in flight (a revoke leaves it none).
HOST_SECRET_ROTATION_DAYS = env_float("HOST_SECRET_ROTATION_DAYS", 30.0)
HOST_SECRET_GRACE_SECONDS = env_float("HOST_SECRET_GRACE_SECONDS", 300.0)
# Image locality: among the placements whose fragmentation rise (milli-GPU that the workload
# is expected to leave unusable, console/scheduler/fragmentation.py) is within this much of
# the least, placement prefers a host that holds the launch's image (no pull). 0: only on a tie.
IMAGE_LOCALITY_TOLERANCE = env_float("IMAGE_LOCALITY_TOLERANCE", 50.0)

# Instances: how host calls are retried before an instance turns `failed` (seconds double
# from INSTANCE_AGENT_RETRY_BACKOFF up to INSTANCE_AGENT_RETRY_BACKOFF_MAX).
INSTANCE_AGENT_MAX_RETRIES = env_int("INSTANCE_AGENT_MAX_RETRIES", 6)
INSTANCE_AGENT_RETRY_BACKOFF = env_int("INSTANCE_AGENT_RETRY_BACKOFF", 2)
INSTANCE_AGENT_RETRY_BACKOFF_MAX = env_int("INSTANCE_AGENT_RETRY_BACKOFF_MAX", 60)
if CELERY_VISIBILITY_TIMEOUT <= INSTANCE_AGENT_RETRY_BACKOFF_MAX:
    raise ImproperlyConfigured(
        f"CELERY_VISIBILITY_TIMEOUT ({CELERY_VISIBILITY_TIMEOUT} s) must exceed "
        f"INSTANCE_AGENT_RETRY_BACKOFF_MAX ({INSTANCE_AGENT_RETRY_BACKOFF_MAX} s): a task held "
        "for its retry's countdown would be delivered twice."
    )
# A launch (provisioning, starting) whose allocation its agent still does not hold this long
# after the instance was placed lost its task (a worker died with it): reconcile queues it
# again. A provision is idempotent at the agent, so a late original is harmless.
LAUNCH_REDRIVE_SECONDS = env_float("LAUNCH_REDRIVE_SECONDS", 10.0)
# The most processes (threads included) a workload may have at once in its container.
INSTANCE_PIDS_LIMIT = env_int("INSTANCE_PIDS_LIMIT", 4096)
# GiB a container may write to its own file system (its writable layer; /workspace aside)
INSTANCE_LAYER_GIB = env_int("INSTANCE_LAYER_GIB", 20)


def _legacy_snapshot_password() -> str:
    """The password of the shared repository from before the store was split per tenant: the
    old SNAPSHOT_PASSWORD (or its file in var/); empty on an install that never had one."""
    return env_str("SNAPSHOT_PASSWORD") or state_dir.stored_secret("snapshot-password")


def _snapshot_master_secret(legacy: str) -> str:
    """The secret every tenant's store password is derived from (console/snapshots/store.py):
    set on every console machine of a deployment, generated into var/ for one machine
    (console.state_dir.prepare); "" before it is made, which the store refuses to use."""
    secret = env_str("SNAPSHOT_MASTER_SECRET")
    if not secret:
        if env_str("SNAPSHOT_PASSWORD"):
            raise ImproperlyConfigured(
                "SNAPSHOT_PASSWORD is set but SNAPSHOT_MASTER_SECRET is not: a deployment sets "
                "the same new master secret on every console machine (README: The snapshot "
                "store)."
            )
        return state_dir.stored_secret("snapshot-master-secret")
    if len(secret) < 32:
        raise ImproperlyConfigured("SNAPSHOT_MASTER_SECRET must be at least 32 characters.")
    if secret == legacy:
        raise ImproperlyConfigured(
            "SNAPSHOT_MASTER_SECRET must be a new secret, not SNAPSHOT_PASSWORD: the shared "
            "store's password went to every host with its jobs."
        )
    return secret


# Snapshots (console/snapshots): the restic repositories every host agent writes volumes'
# snapshots to and restores them from, one per tenant under SNAPSHOT_REPOSITORY (a local path,
# sftp:…, s3:…, rest:…, b2:…, azure:…, gs:…, swift:…, rclone:…; a path must be one every host
# sees), each with its own password derived from SNAPSHOT_MASTER_SECRET. SNAPSHOT_PASSWORD
# opens the shared repository of the snapshots taken before the split (SNAPSHOT_REPOSITORY
# itself). A job carries its one tenant's repository and password (or the shared one's, for a
# snapshot from before the split); shown to no tenant, never logged.
SNAPSHOT_REPOSITORY = env_str("SNAPSHOT_REPOSITORY", str(VAR_DIR / "snapshots"))
SNAPSHOT_PASSWORD = _legacy_snapshot_password()
SNAPSHOT_MASTER_SECRET = _snapshot_master_secret(SNAPSHOT_PASSWORD)
# How often a running snapshot or restore is polled for its progress (seconds)
SNAPSHOT_POLL_SECONDS = env_float("SNAPSHOT_POLL_SECONDS", 1.0)

# The SSH front (`manage.py ssh_front`, console/instances/ssh_front.py): where users reach it,
# `host:port`. Set, the ssh line of every instance goes through it (`ssh -J ID@FRONT
# ID@gpucloud`) and stays the same wherever the instance runs; empty, it names the instance's
# host's gateway. Its host key and the CA that certifies the gateways are generated into these
# files once; every console machine needs the same ones (console/fleet/ssh_authority.py).
SSH_FRONT = env_str("SSH_FRONT")
SSH_FRONT_HOST_KEY_FILE = env_str("SSH_FRONT_HOST_KEY_FILE", str(VAR_DIR / "ssh-front-host-key"))
SSH_CA_KEY_FILE = env_str("SSH_CA_KEY_FILE", str(VAR_DIR / "ssh-ca-key"))

# Billing
BILLING_MINIMUM_SECONDS = env_int("BILLING_MINIMUM_SECONDS", 60)
BILLING_DISK_PRICE_PER_GIB_MONTH = env_decimal("BILLING_DISK_PRICE_PER_GIB_MONTH", "0.10")
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "USD")
BILLING_TAX_RATE = env_decimal("BILLING_TAX_RATE", "0")
BILLING_ISSUER_NAME = env_str("BILLING_ISSUER_NAME", "gpucloud operator")
BILLING_ISSUER_ADDRESS = env_list("BILLING_ISSUER_ADDRESS", "1 Datacenter Way,Springfield")
BILLING_ISSUER_TAX_ID = env_str("BILLING_ISSUER_TAX_ID")  # on issued invoices when set
# How long after a month ends its invoices wait, so late news (a host that went silent just
# before midnight is noticed a little after) still reaches the month.
BILLING_FINALIZE_GRACE_SECONDS = env_int("BILLING_FINALIZE_GRACE_SECONDS", 900)

# Metrics
METRICS_LIVE_WINDOW_SECONDS = env_int("METRICS_LIVE_WINDOW_SECONDS", 600)
METRICS_HISTORY_DAYS = env_int("METRICS_HISTORY_DAYS", 30)
METRICS_SCRAPE_TOKEN = env_str("METRICS_SCRAPE_TOKEN")
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", "127.0.0.1,::1")
# Monitoring that sends `Authorization: Bearer <HEALTHZ_TOKEN>` (or a staff session) reads
# /healthz's details; anyone else gets its status alone (console/health.py).
HEALTHZ_TOKEN = env_str("HEALTHZ_TOKEN")
