"""Engram's wire contracts: the models, the error codes (SPEC section 9), the operation table,
the subjects and the connection file, as both the client and the server use them."""
