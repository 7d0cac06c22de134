"""The keys of a job against the user's code that runs inside it (issue 21, item 2): a model
definition that, once loaded in the PS, tries every way its environment offers to act as the
master or as a worker, and replays every token that other instances send the PS. One local
job, with mutual TLS on."""

from __future__ import annotations

import json
from pathlib import Path

from elastic_step.examples import path_of

# Runs where the PS loads the model definition: its own credentials, its certificate, and
# every value of its environment taken for the key that makes tokens.
ATTACK = """
import json, os, sys, threading

if os.environ.get("ELASTIC_STEP_INSTANCE", "").startswith("ps-"):
    import grpc
    from elastic_step.rpc import auth, master_pb2, master_pb2_grpc

    own = auth.Credentials.from_env(os.environ["ELASTIC_STEP_INSTANCE"])
    master = sys.argv[sys.argv.index("--master") + 1]
    tries = [("own", own)]
    tries += [(f"own token as {n}", auth.Credentials(n, own.token, own.tls))
              for n in ("master", "worker-0", "worker-9")]
    for variable, value in sorted(os.environ.items()):
        if value:
            tries += [(f"{variable} as the key, as {n}",
                       auth.Credentials.for_instance(value, n, own.tls))
                      for n in ("master", "worker-0")]
    answers = {}
    lock = threading.Lock()

    def call_master(label, credentials):
        channel = auth.authenticated_channel(master, credentials, server_role="master")
        with channel:
            try:
                master_pb2_grpc.MasterStub(channel).GetPSAddresses(
                    master_pb2.GetPSAddressesRequest(), timeout=10)
                answer = "OK"
            except grpc.RpcError as e:
                answer = e.code().name
        with lock:
            answers[label] = answer
            with open(os.environ["ATTACK_REPORT"], "w") as f:
                json.dump({"answers": answers, "tls": own.tls is not None}, f)

    for label, credentials in tries:
        call_master(label, credentials)

    # Then every token that reaches this PS in a call (workers' pulls and pushes, the
    # master's), taken from the server's own check and replayed to the master.
    seen = set()
    read = auth._credentials_of

    def spy(metadata):
        name, token = read(metadata)
        if name and token and name not in seen:
            seen.add(name)
            replay = auth.Credentials(name, token, own.tls)
            threading.Thread(target=call_master, args=(f"captured {name}", replay)).start()
        return name, token

    auth._credentials_of = spy
"""


def test_code_in_the_ps_cannot_act_as_the_master_or_a_worker(
    tmp_path: Path, train_run, monkeypatch
) -> None:
    model_def = tmp_path / "curious_model.py"
    model_def.write_text(Path(path_of("digits")).read_text() + ATTACK)
    report = tmp_path / "attack.json"
    monkeypatch.setenv("ATTACK_REPORT", str(report))
    run = train_run("--epochs", "1", "--tls", "on")
    run.argv[run.argv.index("--model-def") + 1] = str(model_def)
    assert run.start().wait() == 0, run.log()[-3000:]
    attack = json.loads(report.read_text())
    answers = attack.pop("answers")
    assert attack == {"tls": True}
    assert answers.pop("own") == "OK"  # the PS's own name: what the others are refused for
    captured = {k for k in answers if k.startswith("captured ")}
    assert {"captured worker-0", "captured worker-1"} <= captured, answers
    assert len(answers) > 20
    assert set(answers.values()) == {"UNAUTHENTICATED"}, answers
    # The refusals are in the master's log, one line each, and the job went on regardless.
    refused = [line for line in run.log().splitlines() if "refused /elastic_step.Master/" in line]
    assert len(refused) == len(answers)
    assert (
        run.summary()["epochs"][0]["records_trained"]
        == run.summary()["epochs"][0]["records_expected"]
    )
