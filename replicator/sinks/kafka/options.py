"""``--kafka-opt KEY=VALUE`` (Kafka's producer property names, as Debezium's ``kafka.producer.*``) -> aiokafka.

Defaults are what at-least-once delivery with per-document order needs: ``acks=all`` and the idempotent
producer. ``acks`` can not be lowered (the checkpoint would move past records the broker might lose).
TLS takes PEM files (``ssl.ca.location`` / ``ssl.certificate.location`` / ``ssl.key.location``, or the
aiokafka-style ``ssl.cafile`` / ``ssl.certfile`` / ``ssl.keyfile``); SASL takes ``sasl.mechanism``,
``sasl.username`` and ``sasl.password``, or a Java ``sasl.jaas.config`` line. Values of secret options are
never echoed in errors.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from replicator.errors import ConfigError, quoted

#: Kafka property -> (aiokafka argument, type)
_SIMPLE: dict[str, tuple[str, type]] = {
    "client.id": ("client_id", str),
    "linger.ms": ("linger_ms", int),
    "batch.size": ("max_batch_size", int),
    "max.batch.size": ("max_batch_size", int),
    "max.request.size": ("max_request_size", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "connections.max.idle.ms": ("connections_max_idle_ms", int),
    "compression.type": ("compression_type", str),
    "security.protocol": ("security_protocol", str),
    "sasl.mechanism": ("sasl_mechanism", str),
    "sasl.username": ("sasl_plain_username", str),
    "sasl.password": ("sasl_plain_password", str),
    "sasl.kerberos.service.name": ("sasl_kerberos_service_name", str),
    "sasl.kerberos.domain.name": ("sasl_kerberos_domain_name", str),
}
_SSL = {
    "ssl.ca.location": "cafile",
    "ssl.cafile": "cafile",
    "ssl.certificate.location": "certfile",
    "ssl.certfile": "certfile",
    "ssl.key.location": "keyfile",
    "ssl.keyfile": "keyfile",
    "ssl.key.password": "password",
    "ssl.password": "password",
}
_SECRET = {"sasl.password", "sasl.jaas.config", "ssl.key.password", "ssl.password"}
_KIND = {int: "a whole number", str: "text"}
_COMPRESSION = ("none", "gzip", "snappy", "lz4", "zstd")
_JAAS_PAIR = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def producer_config(opts: tuple[str, ...], bootstrap: list[str]) -> dict[str, Any]:
    """aiokafka.AIOKafkaProducer keyword arguments for these ``KEY=VALUE`` options."""
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "max_batch_size": 256 * 1024,
        "max_request_size": 1_048_576,
        "request_timeout_ms": 30_000,
    }
    ssl: dict[str, str] = {}
    check_hostname = True
    for opt in opts:
        key, _, value = opt.partition("=")
        key, value = key.strip(), value.strip()
        shown = "***" if key in _SECRET else value
        if key in _SIMPLE:
            name, kind = _SIMPLE[key]
            try:
                config[name] = kind(value)
            except ValueError:
                raise ConfigError(f"--kafka-opt {key}={shown}: not {_KIND[kind]}") from None
        elif key in _SSL:
            ssl[_SSL[key]] = value
        elif key == "ssl.endpoint.identification.algorithm":
            check_hostname = value.lower() == "https"
        elif key == "sasl.jaas.config":
            pairs = dict(_JAAS_PAIR.findall(value))
            if "username" not in pairs or "password" not in pairs:
                raise ConfigError('--kafka-opt sasl.jaas.config: expected username="..." password="..."')
            config["sasl_plain_username"], config["sasl_plain_password"] = pairs["username"], pairs["password"]
        elif key == "acks":
            if value not in ("all", "-1"):
                raise ConfigError(
                    f"--kafka-opt acks={value}: mcdc moves its checkpoint only after acks=all; it cannot be lowered"
                )
        elif key == "enable.idempotence":
            config["enable_idempotence"] = value.lower() in ("true", "1", "yes", "on")
        else:
            raise ConfigError(f"--kafka-opt {key}: not a producer setting mcdc knows ({_known(key)})")
    compression = config.get("compression_type")
    if compression is not None:
        if compression not in _COMPRESSION:
            raise ConfigError(f"--kafka-opt compression.type must be one of {', '.join(_COMPRESSION)}")
        if compression == "none":
            config["compression_type"] = None
        elif compression != "gzip" and not _has_codecs():
            raise ConfigError(f"--kafka-opt compression.type={compression} needs cramjam: pip install 'mcdc[kafka]'")
    if ssl or str(config.get("security_protocol", "")).endswith("SSL"):
        config["ssl_context"] = _ssl_context(ssl, check_hostname)
    return config


#: every setting --kafka-opt takes
KNOWN = sorted(
    {*_SIMPLE, *_SSL, "sasl.jaas.config", "acks", "enable.idempotence", "ssl.endpoint.identification.algorithm"}
)


def _known(key: str) -> str:
    """The setting ``key`` most likely meant (``compresion.type``, ``linger_ms``), else the ones there are."""
    near = difflib.get_close_matches(key.lower().replace("_", "."), KNOWN, n=1, cutoff=0.75)
    return f"did you mean {quoted(near[0])}?" if near else "it takes " + ", ".join(KNOWN)


def _has_codecs() -> bool:
    try:
        import cramjam  # noqa: F401  (aiokafka's snappy/lz4/zstd codecs)
    except ImportError:
        return False
    return True


def _ssl_context(files: dict[str, str], check_hostname: bool) -> Any:
    import ssl

    from aiokafka.helpers import create_ssl_context

    try:
        context = create_ssl_context(**files)
    except (OSError, ValueError) as exc:
        paths = ", ".join(path for name, path in sorted(files.items()) if name != "password") or "(none given)"
        if isinstance(exc, ssl.SSLError):  # also an OSError: its strerror is OpenSSL's "[SSL] PEM lib (_ssl.c:...)"
            why = "not a PEM certificate or key, or the key's password (ssl.key.password) does not open it"
        elif isinstance(exc, OSError) and exc.strerror:
            why = exc.strerror + (f": {exc.filename}" if exc.filename else "")
        else:
            why = "not usable TLS files"
        raise ConfigError(f"--kafka-opt ssl.*: cannot load the TLS files {paths}: {why}") from None
    context.check_hostname = check_hostname
    return context
