"""Data: the storage layer, sharded TFRecord files with an offset index, CSV preprocessing
into shards plus a schema, and the default feed that turns records into model inputs."""
