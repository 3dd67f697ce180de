"""The wire under every service: typed models from bytes and errors as the SPEC 9 envelope,
JetStream streams and durables as code, how durables pull and how a subscriber gets the
whole message. Consuming a stream in batches is ``shared.service.consumer``'s."""
