"""What ML Metadata holds about one KFP run, read with MLMD's own Python client over gRPC:
``python mlmd_query.py HOST:PORT RUN_ID`` (in the venv of build_mlmd.sh) prints, as JSON,
every artifact that a task of the run produced: its type, URI, producing task and custom
properties (where KFP's launcher records an artifact's metadata, and the UI reads it).
"""

from __future__ import annotations

import json
import sys

from google.protobuf import json_format
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

RUN_CONTEXT_TYPE = "system.PipelineRun"


def _value(value: metadata_store_pb2.Value) -> object:
    kind = value.WhichOneof("value")
    if kind == "struct_value":
        return json_format.MessageToDict(value.struct_value)
    return getattr(value, kind) if kind else None


def run_artifacts(store: metadata_store.MetadataStore, run_id: str) -> list[dict]:
    context = store.get_context_by_type_and_name(RUN_CONTEXT_TYPE, run_id)
    if context is None:
        return []
    executions = {e.id: e for e in store.get_executions_by_context(context.id)}
    events = store.get_events_by_execution_ids(list(executions))
    produced = {
        e.artifact_id: e.execution_id for e in events if e.type == metadata_store_pb2.Event.OUTPUT
    }
    types = {t.id: t.name for t in store.get_artifact_types()}
    found = []
    for artifact in store.get_artifacts_by_id(list(produced)):
        execution = executions[produced[artifact.id]]
        found.append(
            {
                "type": types[artifact.type_id],
                "uri": artifact.uri,
                "name": _value(artifact.custom_properties["display_name"])
                if "display_name" in artifact.custom_properties
                else artifact.name,
                "task": _value(execution.custom_properties["task_name"]),
                "execution_id": execution.id,
                "metadata": {k: _value(v) for k, v in artifact.custom_properties.items()},
            }
        )
    return found


def main() -> None:
    address, run_id = sys.argv[1], sys.argv[2]
    host, port = address.rsplit(":", 1)
    config = metadata_store_pb2.MetadataStoreClientConfig(host=host, port=int(port))
    print(json.dumps(run_artifacts(metadata_store.MetadataStore(config), run_id)))


if __name__ == "__main__":
    main()
