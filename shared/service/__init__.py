"""The frame every service runs in: the ``Infra`` it is handed at the composition root, the
``Component`` it returns, the request-reply edge that serves its operations and the batch
consumers that feed its streams."""
