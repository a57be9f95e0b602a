"""Helpers the tests share: signers, servers, browsers, workers, misbehaving handlers."""
