"""The network: the egress guard (which addresses may be reached), the egress proxy's
tunnel, and the peer HTTP client every outgoing call goes through, with one deadline."""
