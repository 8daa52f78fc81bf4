"""Settings, every one read from the environment (see the README's configuration table).

The embedded default needs no services: SQLite, a filesystem Celery broker and a local
object store, all under LORAPLEX_VAR_DIR. Production sets DATABASE_URL, CELERY_BROKER_URL
and LORAPLEX_S3_BUCKET, and LORAPLEX_ENV=production turns on Django's deployment checks.
"""

from pathlib import Path

import environ

from .secrets import development_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

LORAPLEX_ENV = env.str("LORAPLEX_ENV", default="development")
PRODUCTION = LORAPLEX_ENV == "production"
VAR_DIR = Path(env.str("LORAPLEX_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Opt-in only: debug pages show settings and tracebacks to whoever triggers an error.
DEBUG = env.bool("DEBUG", default=False)
if PRODUCTION:
    SECRET_KEY = env.str("SECRET_KEY")  # required: a missing key fails loudly at start-up
    ALLOWED_HOSTS = env.list("ALLOWED_HOSTS")
else:
    SECRET_KEY = env.str("SECRET_KEY", default="") or development_secret_key(VAR_DIR)
    ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# JSON in OpenAI's error shape under /v1/ and /api/ (platform_site/error_pages.py).
CSRF_FAILURE_VIEW = "platform_site.error_pages.csrf_failure"
# Rotating SECRET_KEY must not invalidate every API key, so keys get their own HMAC secret.
API_KEY_HMAC_SECRET = env.str("LORAPLEX_API_KEY_SECRET", default=SECRET_KEY)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tenants",
    "audit",
    "registry",
    "inference",
    "web",
    "platform_site.apps.PlatformSiteConfig",  # the production checks (platform_site/checks.py)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "platform_site.api_paths.CommonMiddleware",  # Django's, but no slash redirects on the API
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "platform_site.urls"
WSGI_APPLICATION = "platform_site.wsgi.application"
ASGI_APPLICATION = "platform_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'loraplex.sqlite3'}")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=0)
# A reused connection is checked before each request: a database restart costs no request.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A server and a worker write the same file: WAL lets readers run beside the writer,
    # IMMEDIATE takes the write lock when a transaction begins (a read-then-write one can
    # then wait its turn instead of failing with "database is locked"), and a writer waits
    # up to `timeout` seconds for the lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )
    # A file, not memory, so a worker process started by a test sees the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# Outside production the apps' static files are served as they are, without collectstatic
# (DEBUG used to imply this); production serves STATIC_ROOT, collected when the image builds.
WHITENOISE_USE_FINDERS = not PRODUCTION
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# Object storage: a local directory by default, S3 (or MinIO) when a bucket is named.
S3_BUCKET = env.str("LORAPLEX_S3_BUCKET", default="")
if S3_BUCKET:
    _default_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": S3_BUCKET,
            "endpoint_url": env.str("AWS_S3_ENDPOINT_URL", default="") or None,
            "region_name": env.str("AWS_S3_REGION_NAME", default="us-east-1"),
            "addressing_style": env.str("AWS_S3_ADDRESSING_STYLE", default="path"),
            "file_overwrite": False,
            "default_acl": None,
            "querystring_auth": True,
        },
    }
else:
    _default_storage = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(VAR_DIR / "objects"), "file_permissions_mode": 0o640},
    }
STORAGES = {
    "default": _default_storage,
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# Celery: kombu's filesystem transport needs no server, so the embedded default still
# runs a real worker process. The in/out folder must be one folder, and the processed
# folder must exist before the worker starts (a missing one loses the message).
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for _sub in ("queue", "processed", "results", "control"):
        (BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),  # else kombu writes ./control
        "store_processed": False,
        "polling_interval": 0.1,
    }
    # kombu's filesystem transport with its messages written whole: filesystem_broker.py.
    # (By the URL's scheme: CELERY_BROKER_TRANSPORT would also override other brokers' URLs.)
    from kombu.transport import TRANSPORT_ALIASES

    TRANSPORT_ALIASES["filesystem"] = "platform_site.filesystem_broker:Transport"
    _default_result_backend = f"file://{BROKER_DIR / 'results'}"
else:
    _default_result_backend = CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else ""
    # A task taken by a worker that dies without a word (SIGKILL, a lost node) goes back to
    # the queue after this many seconds; keep it above the longest task (the hard limit).
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env.int("LORAPLEX_BROKER_VISIBILITY_TIMEOUT", default=3600)
    }
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=_default_result_backend) or None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Adapter registry (see the README's configuration table).
MAX_LORA_RANK = env.int("LORAPLEX_MAX_LORA_RANK", default=64)
# an adapter's whole embed_tokens / lm_head copy (modules_to_save) is served up to this size
MAX_SAVED_MODULE_PARAMS = env.int("LORAPLEX_MAX_SAVED_MODULE_PARAMS", default=2**25)
MAX_ADAPTER_BYTES = env.int("LORAPLEX_MAX_ADAPTER_BYTES", default=512 * 1024 * 1024)
# Eval sets (registry/eval_sets.py): JSONL rows each adapter version is measured on.
EVAL_MAX_ROWS = env.int("LORAPLEX_EVAL_MAX_ROWS", default=200)
EVAL_MAX_BYTES = env.int("LORAPLEX_EVAL_MAX_BYTES", default=1024 * 1024)
# The tokens one evaluation scores (rows times their length, counted as the bytes of their
# texts): bounded, since the worker scores them twice (adapter and base) on the engine.
EVAL_MAX_TOKENS = env.int("LORAPLEX_EVAL_MAX_TOKENS", default=200_000)
# The quality gate (registry/quality.py): a version serves only while its eval-set perplexity
# is at most this factor of its first evaluation's figure, and (when set; off by default) at
# most this factor of the base model's perplexity alone on the same rows.
EVAL_MAX_PPL_RATIO = env.float("LORAPLEX_EVAL_MAX_PPL_RATIO", default=1.10)
EVAL_MAX_BASE_RATIO = env.float("LORAPLEX_EVAL_MAX_BASE_RATIO", default=None)
# An evaluation waits this long for an engine serving its revision (and for object storage),
# trying again at most EVAL_RETRY_MAX_SECONDS apart, before it fails: a base upgrade restarts
# every engine, and loading the largest supported base (70B) takes minutes.
EVAL_WAIT_SECONDS = env.float("LORAPLEX_EVAL_WAIT_SECONDS", default=1800.0)
EVAL_RETRY_MAX_SECONDS = env.float("LORAPLEX_EVAL_RETRY_MAX_SECONDS", default=60.0)
MODELS_DIR = Path(env.str("LORAPLEX_MODELS_DIR", default=str(VAR_DIR / "models")))
ADAPTER_CACHE_DIR = Path(
    env.str("LORAPLEX_ADAPTER_CACHE_DIR", default=str(VAR_DIR / "adapter-cache"))
)
ADAPTER_CACHE_BYTES = env.int("LORAPLEX_ADAPTER_CACHE_BYTES", default=4 * 1024**3)
# Of that, what an engine replica's prefetcher may hold in promoted versions not served yet
# (inference/host/prefetch.py); 0: no prefetching.
PREFETCH_BYTES = env.int("LORAPLEX_PREFETCH_BYTES", default=ADAPTER_CACHE_BYTES // 4)
S3_IMPORT_BUCKETS = env.list("LORAPLEX_S3_IMPORT_BUCKETS", default=[])
S3_IMPORT_ENDPOINT_URL = (
    env.str("LORAPLEX_S3_IMPORT_ENDPOINT_URL", default="")
    or env.str("AWS_S3_ENDPOINT_URL", default="")
    or None
)
S3_IMPORT_REGION = env.str("AWS_S3_REGION_NAME", default="us-east-1")
VALIDATION_DEADLINE_SECONDS = env.int("LORAPLEX_VALIDATION_DEADLINE_SECONDS", default=900)
VALIDATION_MAX_ATTEMPTS = env.int("LORAPLEX_VALIDATION_MAX_ATTEMPTS", default=3)
TASK_RETRIES = env.int("LORAPLEX_TASK_RETRIES", default=5)
TASK_RETRY_BACKOFF_SECONDS = env.float("LORAPLEX_TASK_RETRY_BACKOFF_SECONDS", default=2.0)
TASK_RETRY_BACKOFF_MAX = env.float("LORAPLEX_TASK_RETRY_BACKOFF_MAX", default=300.0)
TASK_SOFT_TIME_LIMIT = env.int("LORAPLEX_TASK_SOFT_TIME_LIMIT", default=600)
# Per-tenant quotas on the registry (0: no limit); a tenant's own value in the admin wins.
QUOTA_PENDING_VERSIONS = env.int("LORAPLEX_QUOTA_PENDING_VERSIONS", default=10)
QUOTA_UPLOADS_PER_HOUR = env.int("LORAPLEX_QUOTA_UPLOADS_PER_HOUR", default=60)
QUOTA_ADAPTER_BYTES = env.int("LORAPLEX_QUOTA_ADAPTER_BYTES", default=20 * 1024**3)
SWEEP_INTERVAL_SECONDS = env.float("LORAPLEX_SWEEP_INTERVAL_SECONDS", default=300.0)
CELERY_BEAT_SCHEDULE = {
    "registry-sweep-stuck-validations": {
        "task": "registry.sweep_stuck_validations",
        "schedule": SWEEP_INTERVAL_SECONDS,
    },
    "registry-sweep-stuck-evaluations": {
        "task": "registry.sweep_stuck_evaluations",
        "schedule": SWEEP_INTERVAL_SECONDS,
    },
    "inference-purge-expired-responses": {
        "task": "inference.purge_expired_responses",
        "schedule": SWEEP_INTERVAL_SECONDS,
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

REDIS_URL = env.str("REDIS_URL", default="")
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # Rate limits fail open when Redis is down (inference/ratelimit.py): fail fast.
            "OPTIONS": {"socket_connect_timeout": 1.0, "socket_timeout": 1.0},
        }
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "platform_site.error_responses.openai_exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "platform_site.parsers.JSONParser",  # DRF's, but too deep a nesting is a 400 too
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Loraplex API",
    "DESCRIPTION": "Tenants, API keys and LoRA adapters over one shared base model.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The OpenAI-compatible /v1 endpoints are plain async views: described in inference/openapi.py.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "inference.openapi.add_v1_paths",
    ],
}

if PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}

# Inference: one engine per `serve` process (see inference/host/engine_host.py).
ENGINE_ENABLED = env.bool("LORAPLEX_ENGINE", default=True)
BASE_MODEL_NAME = env.str("LORAPLEX_BASE_MODEL", default="")
ENGINE_OPTIONS = {
    "device": env.str("LORAPLEX_DEVICE", default="auto"),
    # N > 1 shards the model over N ranks (workers this process starts; on CUDA one device each)
    "tensor_parallel_size": env.int("LORAPLEX_TENSOR_PARALLEL_SIZE", default=1),
    "dtype": env.str("LORAPLEX_DTYPE", default="auto"),
    "attention_backend": env.str("LORAPLEX_ATTENTION_BACKEND", default="auto"),
    "enforce_eager": env.bool("LORAPLEX_ENFORCE_EAGER", default=False),
    "max_cudagraph_capture_size": env.int("LORAPLEX_MAX_CUDAGRAPH_CAPTURE_SIZE", default=None),
    "max_model_len": env.int("LORAPLEX_MAX_MODEL_LEN", default=None),
    "max_num_seqs": env.int("LORAPLEX_MAX_NUM_SEQS", default=64),
    "max_num_batched_tokens": env.int("LORAPLEX_MAX_NUM_BATCHED_TOKENS", default=None),
    # the quality gate's scoring: at most this many tokens a step, never beside decodes alone
    "background_tokens_per_step": env.int("LORAPLEX_BACKGROUND_TOKENS_PER_STEP", default=None),
    # a step's prefill tokens shared by tenant: beside another tenant's short prompt a
    # prompt feeds at most this many (unset: 16 on cpu, 256 on cuda)
    "long_prefill_token_threshold": env.int("LORAPLEX_LONG_PREFILL_TOKEN_THRESHOLD", default=None),
    "max_num_partial_prefills": env.int("LORAPLEX_MAX_NUM_PARTIAL_PREFILLS", default=4),
    # a prefill token counts 1 + its position / this in the step's budget (unset: where the
    # model's attention costs what its linear layers do on cpu, 0 on cuda; 0: tokens count 1)
    "prefill_cost_context": env.int("LORAPLEX_PREFILL_COST_CONTEXT", default=None),
    "kv_cache_bytes": env.int("LORAPLEX_KV_CACHE_BYTES", default=None),
    # on cuda without kv_cache_bytes: the share of device memory the engine sizes within
    "gpu_memory_utilization": env.float("LORAPLEX_GPU_MEMORY_UTILIZATION", default=0.9),
    # unset: the memory pool decides the slot count (inference/engine/memory_pool.py)
    "max_loras": env.int("LORAPLEX_MAX_LORAS", default=None),
    # a fixed split instead: the max_loras slots keep their pages whether adapters use them
    "reserve_lora_slots": env.bool("LORAPLEX_RESERVE_LORA_SLOTS", default=False),
    "max_cpu_loras": env.int("LORAPLEX_MAX_CPU_LORAS", default=32),
    "max_lora_rank": MAX_LORA_RANK,
    "max_saved_module_params": MAX_SAVED_MODULE_PARAMS,
    "lora_extra_bytes": env.int("LORAPLEX_LORA_EXTRA_BYTES", default=None),
    "deterministic_kernels": env.bool("LORAPLEX_DETERMINISTIC_KERNELS", default=False),
    "enable_lora": True,
    "enable_prefix_caching": env.bool("LORAPLEX_ENABLE_PREFIX_CACHING", default=True),
    "enable_chunked_prefill": env.bool("LORAPLEX_ENABLE_CHUNKED_PREFILL", default=True),
    # an emulated GPU (a planner device, e.g. h200) for a planner preset or config.json: the
    # server and engine run for real, each step waits the GPU's time (never set by make run)
    "emulate_device": env.str("LORAPLEX_EMULATE_DEVICE", default=None),
    "emulate_model": env.str("LORAPLEX_EMULATE_MODEL", default=None),
    "emulate_quantization": env.str("LORAPLEX_EMULATE_QUANTIZATION", default=None),
}
PINNED_ADAPTERS = env.list("LORAPLEX_PINNED_ADAPTERS", default=[])  # "tenant/adapter[@alias]"
# vLLM's operator calls (inference/host/lora_loading.py): `tenant/adapter=path` entries
# (spaces between them) registered, loaded and pinned at start-up; the local folders a
# `lora_path` may name (none by default; S3 buckets: LORAPLEX_S3_IMPORT_BUCKETS); how long a
# load waits for the quality gate's verdict before answering that it is still pending.
LORA_MODULES = env.str("LORAPLEX_LORA_MODULES", default="").split()
LORA_PATH_ROOTS = env.list("LORAPLEX_LORA_PATH_ROOTS", default=[])
LORA_LOAD_WAIT_SECONDS = env.float("LORAPLEX_LORA_LOAD_WAIT_SECONDS", default=300.0)
DRAIN_SECONDS = env.int("LORAPLEX_DRAIN_SECONDS", default=30)
RATE_LIMIT_REQUESTS_PER_MINUTE = env.int(
    "LORAPLEX_RATE_LIMIT_RPM", default=600
)  # per API key; 0 = off
RATE_LIMIT_TOKENS_PER_MINUTE = env.int(
    "LORAPLEX_RATE_LIMIT_TPM", default=200_000
)  # per tenant; 0 = off
# max_tokens (inference/openai/max_tokens.py): a chat request without one generates at most
# DEFAULT_MAX_TOKENS (0: up to the end of the context); one asking for more than
# MAX_TOKENS_CAP is refused (0: no cap but the context).
DEFAULT_MAX_TOKENS = env.int("LORAPLEX_DEFAULT_MAX_TOKENS", default=1024)
MAX_TOKENS_CAP = env.int("LORAPLEX_MAX_TOKENS_CAP", default=0)
# POST /v1/responses keeps each answer (unless `store: false`) this many days for
# `previous_response_id` and GET /v1/responses/{id}; past it a response is never served, and
# the beat's purge deletes it.
RESPONSES_RETENTION_DAYS = env.float("LORAPLEX_RESPONSES_RETENTION_DAYS", default=30.0)
TENANT_MAX_CONCURRENCY = env.int(
    "LORAPLEX_TENANT_MAX_CONCURRENCY", default=32
)  # per process; 0 = off
# Tokenizing a caller's text (inference/openai/tokenizing.py): at most this many texts of a
# tenant tokenized at once per process (more: 429; 0 = off), and a text longer than
# max_model_len x MAX_CHARS_PER_TOKEN characters refused before tokenizing (0: only the
# bound no tokenization could fit, the longest token's characters per token).
TENANT_MAX_TOKENIZATIONS = env.int("LORAPLEX_TENANT_MAX_TOKENIZATIONS", default=4)
MAX_CHARS_PER_TOKEN = env.int("LORAPLEX_MAX_CHARS_PER_TOKEN", default=8)
MAX_REQUEST_BYTES = env.int("LORAPLEX_MAX_REQUEST_BYTES", default=1024 * 1024)
# A response's logprob entries (prompt and generated, every choice), known before generation:
# more is a 400 naming the parameter to lower. About 75 bytes of JSON each.
MAX_LOGPROB_ENTRIES = env.int("LORAPLEX_MAX_LOGPROB_ENTRIES", default=200_000)
# A response's bytes (echoed prompts, generated text at the longest token, logprobs; every
# choice), estimated before generation (inference/openai/response_size.py): more is a 400
# naming the parameter to lower (0: off).
MAX_RESPONSE_BYTES = env.int("LORAPLEX_MAX_RESPONSE_BYTES", default=16 * 1024 * 1024)
# The JSON schemas a request carries (response_format, tools' parameters), together: bounds
# checked in one linear pass before the meta-schema check and the grammar compile, whose cost
# grows faster (inference/openai/schema_limits.py).
SCHEMA_LIMITS = {
    "max_bytes": env.int("LORAPLEX_SCHEMA_MAX_BYTES", default=64 * 1024),
    "max_depth": env.int("LORAPLEX_SCHEMA_MAX_DEPTH", default=64),
    "max_properties": env.int("LORAPLEX_SCHEMA_MAX_PROPERTIES", default=1000),
    "max_enum_values": env.int("LORAPLEX_SCHEMA_MAX_ENUM_VALUES", default=1000),
    "max_structured_enum_values": env.int(
        "LORAPLEX_SCHEMA_MAX_STRUCTURED_ENUM_VALUES", default=128
    ),
    "max_branches": env.int("LORAPLEX_SCHEMA_MAX_BRANCHES", default=256),
    "max_repeat": env.int("LORAPLEX_SCHEMA_MAX_REPEAT", default=1000),
}
# Bodies are bounded before Django reads them (platform_site/body_limits.py): every route
# but the adapter upload takes MAX_REQUEST_BYTES, and Django's own check agrees with it.
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES
BODY_TIMEOUT_SECONDS = env.float("LORAPLEX_BODY_TIMEOUT_SECONDS", default=30.0)
# `serve` (uvicorn): open connections per process (503 beyond; 0 = no limit), idle keep-alive.
MAX_CONNECTIONS = env.int("LORAPLEX_MAX_CONNECTIONS", default=1000)
KEEPALIVE_SECONDS = env.int("LORAPLEX_KEEPALIVE_SECONDS", default=5)
OPERATOR_TOKEN = env.str("LORAPLEX_OPERATOR_TOKEN", default="")
# Set: /metrics answers only `Authorization: Bearer <token>`, adapter names included.
# Unset (the embedded default): /metrics answers anyone, without tenant or adapter names.
METRICS_TOKEN = env.str("LORAPLEX_METRICS_TOKEN", default="")
# Operators' admin: the engine processes' operator endpoints (pin/unpin, loaded adapters, metrics).
ENGINE_URLS = [u.rstrip("/") for u in env.list("LORAPLEX_ENGINE_URLS", default=[])]
