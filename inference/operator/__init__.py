"""The engine's operator endpoints: loading, pinning and listing adapters by registry name,
and the quality gate's scoring. What they and the control plane's client agree on is
platform_site/operator_protocol.py."""
