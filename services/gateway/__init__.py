"""The HTTP gateway: REST routes under ``/v1`` built from the operation table
(``contracts/operations.py``), each turned into the same NATS request-reply a NATS client would
make, with the caller's ``Authorization`` header passed through unchanged. It holds no business
logic and no database connection (SPEC 10, ARCHITECTURE 1)."""
