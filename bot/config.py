"""Settings: the only place that reads the environment (and `.env`)."""

from __future__ import annotations

import ipaddress
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_DATA_DIR = Path("data")
# The embedded default model, trained once and committed with its recipe (models/chitchat/).
SHIPPED_MODEL_FILE = Path(__file__).resolve().parents[1] / "models" / "chitchat" / "model"
# Telegram takes 1-256 characters of A-Za-z0-9_- as a webhook secret; we want at least 16: it is
# all that tells Telegram's posts from forged ones, and a short one would shred the logs, where
# every occurrence of it is redacted.
WEBHOOK_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{16,256}")
# The fewest characters of a secret that the logs mask wherever it appears (bot.logs): a
# shorter one turns up inside ordinary words, and masked there it gives itself away
# (`d[REDACTED]shbo[REDACTED]rd` for `a`). DASHBOARD_PASSWORD must be at least this long (it is
# all that guards the dashboard, too); a shorter database password is masked in URLs only.
SECRET_MIN_CHARS = 12
# The token as a systemd credential (deploy/systemd/telegram-bot@.service, LoadCredential=):
# this file of $CREDENTIALS_DIRECTORY, read when TELEGRAM_BOT_TOKEN is not set.
TOKEN_CREDENTIAL = "telegram-bot-token"
# An ALLOWED_USERS / ALLOWED_CHATS entry: a Telegram id (chats' are negative) or an
# @username (Telegram's are 5-32 characters of A-Za-z0-9_; shorter ones are let through).
ACCESS_SUBJECT_RE = re.compile(r"-?[0-9]{1,19}|@[A-Za-z0-9_]{1,32}")
# A DNS name or an IPv4 address, as a Host header carries it (less the port).
HOST_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")


def _host_name(text: str) -> str:
    """`text` as the dashboard compares a Host header's name: lower case, an IPv6 address
    without brackets. ValueError for anything else (a port, a scheme, a path)."""
    name = text.lower().removeprefix("[").removesuffix("]")
    if ":" in name:
        ipaddress.IPv6Address(name)  # else it was a port
    elif not HOST_NAME_RE.fullmatch(name):
        raise ValueError(text)
    return name


# More torch threads than cores only slows a process down, and thousands of them have taken a
# host down: every thread count is bounded by the machine's cores.
CORES = os.cpu_count() or 1


class ConfigError(Exception):
    """A setting is missing or wrong; the message says what to set."""


class Settings(BaseSettings):
    """Every knob of the service. Field names map to upper-case environment variables."""

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
        # `NAME=` (as .env.example has it) means unset, not an empty value to parse.
        env_ignore_empty=True,
    )

    # --- Telegram -------------------------------------------------------------------------
    telegram_bot_token: SecretStr | None = None
    telegram_base_url: str = "https://api.telegram.org/bot"
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    webhook_listen: str = "0.0.0.0"
    webhook_port: int = Field(default=8443, ge=1, le=65535)
    admin_user_ids: Annotated[list[int], NoDecode] = Field(default_factory=list)
    group_policy: Literal["mention", "all", "ignore"] = "mention"
    # Who may talk to the bot (bot/service/access.py): user ids or @usernames, and chat ids or
    # @names; both empty (and no `admin access allow`): everyone. ADMIN_USER_IDS always pass.
    allowed_users: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_chats: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Replies per user per UTC day and per minute (`admin access quota` sets a user's own);
    # unset: no limit.
    quota_per_day: int | None = Field(default=None, ge=1)
    quota_per_minute: int | None = Field(default=None, ge=1)

    # --- storage --------------------------------------------------------------------------
    data_dir: Path = DEFAULT_DATA_DIR
    database_url: SecretStr | None = None
    # The read-only PostgreSQL role `admin sql` runs as (`python -m bot db readonly-role`).
    admin_database_url: SecretStr | None = None

    # --- model and engine -----------------------------------------------------------------
    bot_model: str | None = None
    # The language the model writes in (an IETF tag): /help says so in every language, and
    # the safety gate's deflection, which the model reads back, is in it. Replies are never
    # translated (docs/guarantees.md, invariant 17).
    bot_model_language: str = Field(default="en", pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8})*$")
    model_device: Literal["auto", "cpu", "cuda"] = "auto"
    torch_threads: int | None = Field(default=None, ge=1, le=CORES)
    agent_cache_size: int = Field(default=1000, ge=1, le=1_000_000)
    batch_max_size: int = Field(default=16, ge=1, le=1024)
    batch_max_wait_ms: int = Field(default=20, ge=0, le=10_000)
    # "continuous": chats join and leave the running generation at every decoding step
    # (bot/inference/scheduler.py; greedy, beam and delayed beam on the stock transformer);
    # "batch": the micro-batcher, each batch_act runs to its longest reply. Other searches
    # always micro-batch.
    scheduler: Literal["continuous", "batch"] = "continuous"
    # Private chats see the reply grow (sendMessageDraft: "Thinking…", then the best
    # hypothesis so far, about once a second); the final message is sent as always.
    stream_replies: bool = True
    # Generation overrides; None keeps what the model file says.
    inference: Literal["beam", "greedy", "topk", "nucleus", "delayedbeam"] | None = None
    beam_size: int | None = Field(default=None, ge=1)
    beam_min_length: int | None = Field(default=None, ge=0)
    beam_block_ngram: int | None = None
    beam_context_block_ngram: int | None = None
    # "fast": our batched beam search for transformer generators; "parlai": ParlAI's own.
    search_impl: Literal["fast", "parlai"] = "fast"
    # int8 dynamic quantization of the linear layers (CPU only): faster greedy decoding.
    quantize: Literal["none", "int8"] = "none"
    # The model's weights and activations: fp32 (ParlAI's replies bit for bit), or, opt-in,
    # bf16 (CPUs with AMX or AVX-512-bf16; GPUs) or fp16 (GPUs); the search adds up in fp32.
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    # Micro-batches: the encoder over buckets of contexts of similar length instead of one batch
    # padded to the longest (less padding work; replies may differ from ParlAI's in a near-tie).
    encoder_buckets: bool = False
    train_minutes: float = Field(default=12.0, gt=0, le=15)

    # --- variants and feedback ------------------------------------------------------------
    # Named model variants served side by side (bot/engine/variants.py); unset: BOT_MODEL only.
    variants_file: Path | None = None
    # "process": every variant in a worker process of its own; "inline": in this process.
    model_workers: Literal["process", "inline"] = "process"
    # Where the variants' models run: "local" on this machine (MODEL_WORKERS), "ray" in a Ray
    # Serve deployment per variant (bot/engine/backends/ray/; `pip install '.[ray]'`).
    model_backend: Literal["local", "ray"] = "local"
    # MODEL_BACKEND=ray: the Ray cluster to join (host:6379, or ray://host:10001); unset: a
    # local Ray instance is started, owned by this process and stopped with it.
    ray_address: str | None = None
    # The CPUs of that local Ray instance (None: every core); a variant's replica takes
    # `num_cpus` of them (1 unless its table in VARIANTS_FILE says otherwise).
    ray_num_cpus: int | None = Field(default=None, ge=1, le=1024)
    # Torch threads per worker process (a variant's `threads` wins); None: TORCH_THREADS.
    worker_threads: int | None = Field(default=None, ge=1, le=CORES)
    # A worker that answers no ping, or makes no decoding step while it has work, for this
    # long is killed and restarted; its turns are retried on the new one
    # (bot/engine/backends/local.py).
    worker_stall_s: float = Field(default=10.0, ge=2.0, le=600.0)
    # Every turn's deadline, waiting for a restarting worker included; then it fails (and is
    # retried, then apologised for, like any failed turn).
    generation_timeout_s: float = Field(default=120.0, ge=5.0, le=3600.0)
    # 👍/👎 under every reply and the 1-5 rating at /done.
    feedback_buttons: bool = True
    # Let users pick a variant by name with /model (the experiment is blind otherwise).
    allow_model_choice: bool = False
    # /arena: the next message gets two variants' replies, the user picks the better one.
    arena: bool = False

    # --- conversation touches ---------------------------------------------------------------
    # Named personas for /persona use NAME and t.me/<bot>?start=persona_NAME (bot/presets.py).
    personas_file: Path | None = None
    # A text file that replaces the built-in /privacy notice (plain text).
    privacy_file: Path | None = None
    # Delete conversations (and their feedback) and delivered texts older than this many days.
    retention_days: int | None = Field(default=None, ge=1)

    # --- safety ---------------------------------------------------------------------------
    # block: offensive replies replaced (next clean beam, else a deflection), offensive personas
    # refused; flag: kept but marked for the admins; off: no classifier (bot/safety.py).
    safety: Literal["off", "flag", "block"] = "block"
    # The classifier's probability from which a text counts as offensive.
    safety_threshold: float = Field(default=0.5, gt=0, lt=1)

    # --- admin dashboard (bot/dashboard) -----------------------------------------------------
    # `python -m bot dashboard`, and beside `run` when DASHBOARD_PORT is set. No password: no
    # dashboard (and a non-loopback DASHBOARD_LISTEN without one is refused at start).
    dashboard_listen: str = "127.0.0.1"
    dashboard_port: int | None = Field(default=None, ge=1, le=65535)
    dashboard_password: SecretStr | None = None
    # Host names it answers to besides DASHBOARD_LISTEN and loopback's (a TLS proxy's public
    # name); a request for any other (DNS rebinding) is refused.
    dashboard_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # --- limits ---------------------------------------------------------------------------
    persona_max_chars: int = Field(default=1000, ge=1)
    message_max_chars: int = Field(default=2000, ge=1)
    flood_max_messages: int = Field(default=12, ge=1)
    flood_window_s: float = Field(default=10.0, gt=0)
    max_concurrent_chats: int = Field(default=64, ge=1, le=10_000)
    # Chats whose texts are being sent at once, half for private chats and half for groups
    # (bot/service/delivery.py: ChatKinds); one still at it after a second no longer counts.
    delivery_concurrency: int = Field(default=8, ge=2, le=10_000)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    # Replicas on one database: a replica whose heartbeat is this old is dead and its chats are
    # taken over (it fences itself at 60% of it); it beats five times in this time.
    takeover_after_s: float = Field(default=5.0, ge=1.0, le=300.0)

    log_level: str = "INFO"
    # text: one readable line per record; json: one JSON object per line (bot/logs.py).
    log_format: Literal["text", "json"] = "text"

    # --- metrics and health (bot/service/health.py) -----------------------------------------
    # /metrics (Prometheus), /healthz and /readyz on this port; unset: not served.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_listen: str = "127.0.0.1"
    # /readyz fails when the oldest update waiting in the inbox is older than this.
    ready_max_inbox_lag_s: float = Field(default=60.0, gt=0)

    @field_validator("admin_user_ids", mode="before")
    @classmethod
    def _split_ids(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.replace(";", ",").split(",")]
            try:
                return [int(p) for p in parts if p]
            except ValueError as err:
                raise ValueError(
                    "ADMIN_USER_IDS must be numeric Telegram user ids separated by commas"
                ) from err
        if isinstance(value, int):
            return [value]
        return value

    @field_validator("allowed_users", "allowed_chats", mode="before")
    @classmethod
    def _split_subjects(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, int):
            value = str(value)
        if not isinstance(value, str):
            return value
        parts = [p.strip() for p in value.replace(";", ",").split(",")]
        subjects = [p for p in parts if p]
        bad = [p for p in subjects if not ACCESS_SUBJECT_RE.fullmatch(p)]
        if bad:
            # The first bad entry's position, not its text: enough to find it.
            raise ValueError(
                f"{(info.field_name or '').upper()} must be numeric Telegram ids or @usernames "
                f"separated by commas (e.g. 123456789,@alice); entry {subjects.index(bad[0]) + 1} "
                "is neither"
            )
        return [p.lower() for p in subjects]

    @field_validator("dashboard_allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            return [_host_name(p) for p in (p.strip() for p in value.split(",")) if p]
        except ValueError as err:
            raise ValueError(
                "DASHBOARD_ALLOWED_HOSTS must be host names or addresses separated by commas, "
                "without scheme or port (e.g. dash.example.org)"
            ) from err

    @field_validator("webhook_secret")
    @classmethod
    def _check_webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        secret = value.get_secret_value() if value is not None else ""
        if secret and not WEBHOOK_SECRET_RE.fullmatch(secret):
            # ConfigError, not ValueError: pydantic lets it through as it is, so the command
            # line prints this message instead of a validation traceback. Never the value.
            raise ConfigError(
                "WEBHOOK_SECRET must be 16 to 256 characters of A-Z, a-z, 0-9, _ and - "
                f"(this one has {len(secret)} characters"
                + ("" if re.fullmatch(r"[A-Za-z0-9_-]*", secret) else ", some of them others")
                + "); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("dashboard_password")
    @classmethod
    def _check_dashboard_password(cls, value: SecretStr | None) -> SecretStr | None:
        secret = value.get_secret_value().strip() if value is not None else ""
        if secret and len(secret) < SECRET_MIN_CHARS:
            # ConfigError, as for WEBHOOK_SECRET: the message, not a traceback. Never the value.
            raise ConfigError(
                f"DASHBOARD_PASSWORD must have at least {SECRET_MIN_CHARS} characters (not "
                "counting spaces at either end): a passphrase of a few words, or e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe(16))'"
            )
        return value

    @model_validator(mode="after")
    def _token_from_credential(self) -> Settings:
        """TELEGRAM_BOT_TOKEN unset (environment and .env): the token from systemd's
        credential $CREDENTIALS_DIRECTORY/telegram-bot-token, when there is one. As a
        setting, it is masked in the logs like any token (bot.logs.settings_secrets)."""
        if self.telegram_bot_token is not None and self.telegram_bot_token.get_secret_value():
            return self
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            return self
        path = Path(directory) / TOKEN_CREDENTIAL
        try:
            token = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return self  # require_token says what to do
        except (OSError, UnicodeDecodeError) as err:
            why = err.strerror if isinstance(err, OSError) else "it is not UTF-8 text"
            raise ConfigError(
                f"cannot read the token credential {path}: {why}; check the file that "
                f"LoadCredential={TOKEN_CREDENTIAL}:... names in the systemd unit"
            ) from None
        if token:
            self.telegram_bot_token = SecretStr(token)
        return self

    @field_validator("log_level")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()

    @property
    def db_url(self) -> str:
        """The SQLAlchemy URL; the default is an SQLite file under the data directory."""
        if self.database_url is not None and self.database_url.get_secret_value():
            return self.database_url.get_secret_value()
        return f"sqlite+aiosqlite:///{self.data_dir / 'bot.sqlite3'}"

    @property
    def default_model_file(self) -> Path:
        """Where `python -m bot train` writes the embedded default model."""
        return self.data_dir / "models" / "chitchat" / "model"

    @property
    def model_file(self) -> str:
        """The model to serve: BOT_MODEL; else a default model trained here (`make train`);
        else the default model shipped in the repository (models/chitchat/); else where a
        first start trains one."""
        if self.bot_model:
            return self.bot_model
        trained = self.default_model_file
        if (
            Path(str(trained) + ".opt").is_file()
            or not SHIPPED_MODEL_FILE.with_suffix(".opt").is_file()
        ):
            return str(trained)
        return str(SHIPPED_MODEL_FILE)

    def require_token(self) -> str:
        """Return the bot token or raise ConfigError with what to do."""
        token = self.telegram_bot_token.get_secret_value() if self.telegram_bot_token else ""
        if not token.strip():
            directory = os.environ.get("CREDENTIALS_DIRECTORY")
            where = (
                f" (or into the credential file {Path(directory) / TOKEN_CREDENTIAL}, which "
                f"is missing or empty: LoadCredential={TOKEN_CREDENTIAL}:PATH in the unit)"
                if directory
                else ""
            )
            raise ConfigError(
                "TELEGRAM_BOT_TOKEN is not set: put the token from @BotFather into .env "
                f"(see .env.example) or the environment{where}. To try the bot without "
                "Telegram, run `make chat`."
            )
        if self.webhook_url and not (
            self.webhook_secret and self.webhook_secret.get_secret_value().strip()
        ):
            raise ConfigError(
                "WEBHOOK_URL is set but WEBHOOK_SECRET is not: set WEBHOOK_SECRET to 16-256 "
                "characters of A-Z, a-z, 0-9, _ and - so that only Telegram can post updates."
            )
        return token


def describe_invalid_settings(err: ValidationError) -> str:
    """One line per bad setting, named as in the environment; values are never echoed (a
    mistyped variable may hold a secret)."""
    lines = []
    for problem in err.errors():
        name = "_".join(str(part) for part in problem["loc"][:1]).upper() or "settings"
        lines.append(f"{name}: {problem['msg']}")
    return "invalid settings (environment or .env):\n  " + "\n  ".join(lines)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
