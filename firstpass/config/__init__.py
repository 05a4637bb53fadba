"""``firstpass.toml`` → frozen, validated config objects (see docs/config.md for every key).

    config = load_config()            # path → $FIRSTPASS_CONFIG → ./firstpass.toml
    route = config.route_for("demo")  # RouteConfig | None
    price = config.price(route.ladder[0].name)

Validation happens once, at start: any problem is a ``ConfigError`` whose message starts with the
key path (``route[0].ladder[1]: unknown provider "opnai" (known: replay, openai)``).
"""

from __future__ import annotations

from firstpass.config._applicability import (
    NULL_UNKNOWN,
    SKIP_SAFE_FIELDS,
    Applied,
    RequestDraw,
    applicable,
    unbound_fields,
)
from firstpass.config._build import config_from_dict
from firstpass.config._certificate import (
    Certificate,
    CertificateFile,
    GateContext,
    Given,
    Licence,
    calibration_id,
    candidate_rule,
    read_certificates,
)
from firstpass.config._digest import config_digest, public_dict
from firstpass.config._elastic import counts_spend, probe_output_cap
from firstpass.config._env import (
    ENV_CONFIG,
    ENV_ELASTIC_MODE,
    ENV_HOST,
    ENV_PORT,
    ENV_RECEIPTS,
)
from firstpass.config._load import DEFAULT_CONFIG, load_config, resolve_config_path
from firstpass.config._model import (
    ANY_MODEL,
    MAX_K,
    REPLICA_RE,
    REPLICA_RULE,
    REQUEST_MODES,
    SPILL_MAX_BYTES,
    BudgetsConfig,
    ClientKey,
    Config,
    ElasticConfig,
    ObservabilityConfig,
    Price,
    ProviderConfig,
    ReceiptsConfig,
    RequestMode,
    Revision,
    RouteChecks,
    RouteConfig,
    Rung,
    SandboxSettings,
    ServerConfig,
)
from firstpass.config._signature import CalibrationSignature, sign_calibration, signature_problem

__all__ = [
    "ANY_MODEL",
    "DEFAULT_CONFIG",
    "ENV_CONFIG",
    "ENV_ELASTIC_MODE",
    "ENV_HOST",
    "ENV_PORT",
    "ENV_RECEIPTS",
    "MAX_K",
    "NULL_UNKNOWN",
    "REPLICA_RE",
    "REPLICA_RULE",
    "REQUEST_MODES",
    "SKIP_SAFE_FIELDS",
    "SPILL_MAX_BYTES",
    "Applied",
    "BudgetsConfig",
    "CalibrationSignature",
    "Certificate",
    "CertificateFile",
    "ClientKey",
    "Config",
    "ElasticConfig",
    "GateContext",
    "Given",
    "Licence",
    "ObservabilityConfig",
    "Price",
    "ProviderConfig",
    "ReceiptsConfig",
    "RequestDraw",
    "RequestMode",
    "Revision",
    "RouteChecks",
    "RouteConfig",
    "Rung",
    "SandboxSettings",
    "ServerConfig",
    "applicable",
    "calibration_id",
    "candidate_rule",
    "config_digest",
    "config_from_dict",
    "counts_spend",
    "load_config",
    "probe_output_cap",
    "public_dict",
    "read_certificates",
    "resolve_config_path",
    "sign_calibration",
    "signature_problem",
    "unbound_fields",
]
