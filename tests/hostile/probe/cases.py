"""The probe's cases, grouped by the surface they attack (the group is what `--only` matches, besides names)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from ...support.bundles import edit_bundle, members, with_target_file, write_tar, zeros_bundle
from ...support.bundles import member_info as info
from .builders import (
    bench_env,
    benchmarks_dir,
    bj_with,
    calibration_special,
    deep,
    drafter_case,
    export_drafter_file,
    export_existing,
    export_links,
    export_links_check,
    fifo_report,
    fifo_target,
    full_fs,
    gate_base,
    gate_new,
    hang_drafter,
    home_file_case,
    home_unchanged,
    huge_header_drafter,
    import_case,
    journal_fifo,
    kill_case,
    kill_check,
    legacy_stage,
    lock_case,
    mini_with_auto_map,
    mode_case,
    nan_drafter,
    nested_manifest,
    no_report_named,
    no_seed_folder,
    other_uid_case,
    out_file_case,
    planted_artifacts_link,
    prompts_accepted,
    prompts_case,
    quick,
    report_with,
    reports_read_only,
    reports_under_file,
    rounds_case,
    row,
    rss_case,
    rss_check,
    saved_with,
    shard_index,
    stray_bundle,
    target_with,
    verify_cost_case,
    write_bytes,
    zero_report,
)
from .judge import Case
from .material import cli, report


def cases() -> list[Case]:
    C = Case
    mini, local = "mini_bundle", "local_bundle"
    run_argv = ["run", "--method", "dflash", "--prompt", "def f(x):", "--tokens", "4"]

    def imp(group, name, make, words=(), home_from="mini"):
        return C(group, name, import_case(make, home_from), words=words, check=home_unchanged)

    def b(name, edit, which=local, extra=()):
        return lambda d, s: edit_bundle(s[which], d / f"{name}.tar.gz", edit, extra)

    L = [
        # 1. target_dir / artifact_dir / member paths that leave the home
        imp("1 security", "target_dir ../bundle (artifacts-only)", b("t1", lambda x: x.update(target_dir="../bundle")),
            ("target directory",), "local"),
        imp("1 security", "target_dir ../../targets", b("t2", lambda x: x.update(target_dir="../../targets")),
            ("target directory",), "local"),
        imp("1 security", "target_dir absolute", b("t3", lambda x: x.update(target_dir=str(Path("/tmp")))),
            ("target directory",), "local"),
        imp("1 security", "artifact_dir ../../x", b("t4", lambda x: x.update(artifact_dir="artifacts/../../x")),
            ("artifact directory",)),
        imp("1 security", "member ../escaped.txt", b("t5", None, extra=[(info("../escaped.txt"), b"x")]),
            ("unlisted",)),
        imp("1 security", "member with an absolute path", b("t6", None, extra=[(info("/tmp/abs-probe.txt"), b"x")]),
            ("unlisted",)),
        imp("1 security", "symlink member to /etc/passwd",
            b("t7", None, which=mini, extra=[(info("targets/mini/link", tarfile.SYMTYPE, "/etc/passwd"), b"")]),
            ("link",)),
        imp("1 security", "hardlink member",
            b("t8", None, extra=[(info("artifacts/x", tarfile.LNKTYPE, "bundle.json"), b"")]), ("link",)),
        imp("1 security", "target_dir targets/mini/../../../bundle",
            b("t9", lambda x: x.update(target_dir="targets/mini/../../../bundle")), ("target directory",), "local"),
        # 2. resource use before refusing
        imp("2 bomb", "2 GiB zero member before bundle.json", lambda d, s: zeros_bundle(d / "z.tar.gz", 2 << 30),
            ("does not start with bundle.json",)),
        imp("2 bomb", "512 MiB unlisted member after bundle.json",
            lambda d, s: zeros_bundle(d / "z.tar.gz", 512 << 20, head=[m for m in members(s[local])[:1]]),
            ("unlisted",)),
        imp("2 bomb", "member larger than listed",
            lambda d, s: write_tar(d / "big.tar.gz", [(m, data + b"\0" * 4096 if m.name.endswith(
                "drafter.safetensors") else data) for m, data in members(s[local])]), ("truncated or altered",)),
        imp("2 bomb", "listed bytes over the cap",
            b("t10", lambda x: [v.update(bytes=9 << 30) for v in list(x["files"].values())[:2]]), ("limit",)),
        # 3. crash safety
        *[C("3 crash", f"import killed at {st}", kill_case(st), expect="ok", check=kill_check)
          for st in ("extracted", "journal", "backup:{adir}", "moved:{adir}", "backup:targets/mini",
                     "moved:targets/mini", "done")],
        C("3 crash", "stage an older release stranded", legacy_stage, expect="ok", check=kill_check),
        # 4. what travels
        C("4 export", "export with a symlink to /etc/passwd and stray files", export_links, expect="ok",
          check=export_links_check),
        imp("4 import", "bundle listing targets/mini/modeling_evil.py",
            lambda d, s: with_target_file(s[mini], d / "evil.tar.gz", "modeling_evil.py", b"import os\n"),
            ("modeling_evil.py",)),
        imp("4 import", "20,000 empty folders",
            lambda d, s: write_tar(d / "dirs.tar.gz", members(s[local])[:1] + [
                (info(f"artifacts/d{i}", tarfile.DIRTYPE), b"") for i in range(20_000)]), ("folder",)),
        imp("4 import", "a file listed in bundle.json but not in the manifest",
            lambda d, s: stray_bundle(d, s), ("stray",)),
        # 5. bounded resources
        C("5 resources", "report on 15k rounds (bounded memory)", lambda d, s: rss_case(d, s, 15_000),
          expect="ok", check=rss_check),
        C("5 resources", "report on 50k rounds", lambda d, s: rounds_case(d, s, 50_000), words=("20000",)),
        C("5 resources", "report on 1M rounds", lambda d, s: rounds_case(d, s, 1_000_000)),
        # 6. the gate
        C("6 gate", "NaN speedup on a regressed row", lambda d, s: gate_new(d, s, lambda x: row(x, speedup=float(
            "nan"))), words=("NaN",)),
        C("6 gate", "NaN tokens per call on a regressed row", lambda d, s: gate_new(d, s, lambda x: row(
            x, tokens_per_target_call=float("nan"))), words=("NaN",)),
        C("6 gate", "--speedup-drop nan with a 69 % regression",
          lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(s["slower_bj"]), "--speedup-drop", "nan")},
          words=("finite fraction",)),
        C("6 gate", "a 69 % regression is caught", lambda d, s: {"argv": report("gate", str(s["base_bj"]),
                                                                                 str(s["slower_bj"]))},
          expect="regression"),
        C("6 gate", "all_exact 'false' (a string) with a failure", lambda d, s: gate_new(
            d, s, lambda x: x["exactness"].update(all_exact="false", failures=["dflash-w2"]), base_as_new=True),
          words=("all_exact",)),
        C("6 gate", "--tau-tolerance -1 on identical runs",
          lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(s["base_bj"]), "--tau-tolerance", "-1")},
          words=("finite fraction",)),
        C("6 gate", "methods: []", lambda d, s: gate_base(d, s, lambda x: x.update(methods=[]))),
        C("6 gate", "rows: []", lambda d, s: gate_base(d, s, lambda x: x["methods"]["dflash"].update(rows=[]))),
        C("6 gate", "100k-deep JSON", lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(
            bj_with(d, s["base_bj"], None, raw=deep())))}, words=("nests deeper",)),
        C("6 gate", "a missing file", lambda d, s: {"argv": report("gate", str(s["base_bj"]), str(d / "nope.json"))}),
        C("6 gate", "a missing /file (pathlib's glob)", lambda d, s: {"argv": report(
            "gate", str(s["base_bj"]), "/dflash-probe-missing.json"), "cwd": benchmarks_dir(d)}),
        C("6 gate", "speedup as a string", lambda d, s: gate_new(d, s, lambda x: row(x, speedup="1.5"),
                                                                  base_as_new=True)),
        # 7. validate before work
        C("7 bench", "DFLASH_TOKENS=abc bench --smoke", lambda d, s: bench_env(d, s, DFLASH_TOKENS="abc"),
          words=("DFLASH_TOKENS",), check=quick(20)),
        C("7 bench", "DFLASH_WIDTHS=99 bench --smoke", lambda d, s: bench_env(d, s, DFLASH_WIDTHS="99"),
          words=("block size",), check=no_report_named),
        C("7 bench", "bench -- --bench-widths 0", lambda d, s: {**bench_env(d, s), "argv": cli(
            "bench", "--smoke", "--", "--bench-widths", "0")}, words=("--bench-widths",), check=quick(20)),
        C("7 bench", "DFLASH_THREADS=1000000 bench", lambda d, s: bench_env(d, s, DFLASH_THREADS="1000000"),
          words=("DFLASH_THREADS",), check=quick(20)),
        # 8. resource blow-ups before any check
        C("8 bounds", "run --threads 1000000", lambda d, s: {"argv": cli(*run_argv, "--threads", "1000000")},
          words=("<= 256",)),
        C("8 bounds", "DFLASH_THREADS=1000000 run", lambda d, s: {"argv": cli(*run_argv),
                                                                  "env": {"DFLASH_THREADS": "1000000"}},
          words=("DFLASH_THREADS",)),
        C("8 bounds", "--drafter num_hidden_layers 100000", drafter_case(num_hidden_layers=100_000),
          words=("num_hidden_layers",)),
        C("8 bounds", "--drafter intermediate_size 1e9", drafter_case(intermediate_size=1e9),
          words=("intermediate_size",)),
        C("8 bounds", "--drafter intermediate_size 10**9 (int)", drafter_case(intermediate_size=10 ** 9),
          words=("intermediate_size",)),
        C("8 bounds", "--target config with 100,000 layers", lambda d, s: target_with(d, s, num_hidden_layers=100_000),
          words=("num_hidden_layers",)),
        C("8 bounds", "--target config with hidden 10**7", lambda d, s: target_with(d, s, hidden_size=10 ** 7),
          words=("hidden_size",)),
        # 9. non-finite drafter weights
        C("9 weights", "--drafter with NaN weights", lambda d, s: nan_drafter(d, s, float("nan")),
          words=("NaN",), check=quick(60)),
        C("9 weights", "--drafter with inf weights", lambda d, s: nan_drafter(d, s, float("inf")),
          words=("NaN or infinite",), check=quick(60)),
        # 10. hangs
        C("10 hangs", "--drafter model.safetensors -> /dev/zero", lambda d, s: hang_drafter(d, s, "zero"),
          words=("not a regular file",), check=quick(30)),
        C("10 hangs", "--drafter model.safetensors is a FIFO", lambda d, s: hang_drafter(d, s, "fifo"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "--drafter config.json is a FIFO", lambda d, s: hang_drafter(d, s, "config"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "--target model.safetensors is a FIFO", lambda d, s: fifo_target(d, s, "model.safetensors"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "--target tokenizer.json is a FIFO", lambda d, s: fifo_target(d, s, "tokenizer.json"),
          words=("FIFO",), check=quick(30)),
        C("10 hangs", "report input is a FIFO", lambda d, s: fifo_report(d), words=("FIFO",), check=quick(30)),
        C("10 hangs", "report input -> /dev/zero", lambda d, s: zero_report(d), words=("not a regular file",),
          check=quick(30)),
        # 11. misleading or unreadable
        C("11 misleading", "import onto a full filesystem", full_fs("import", False),
          words=("no space left on device",), needs_root=True),
        C("11 misleading", "auto_map in the mini target's config", mini_with_auto_map, words=("auto_map",)),
        C("11 misleading", "mini target weights get the umask's mode", mode_case, expect="ok", words=("modes ok",)),
        C("11 misleading", "artifacts unreadable for another uid", other_uid_case, needs_root=True),
        # the tracebacks of the issue
        C("tb report", "report on 100k-deep JSON", lambda d, s: {"argv": report(str(
            saved_with(d, s, raw=deep())), "--out", str(d / "r"))}, words=("nests deeper",)),
        C("tb report", "report on rounds of 1e308", lambda d, s: report_with(d, s, speedup_rounds=[1e308, 1e308])),
        C("tb report", "report on a 400-digit integer", lambda d, s: {"argv": report(str(saved_with(
            d, s, raw=s["base_run"].read_text().replace('"speedup": 1.5', '"speedup": ' + "9" * 400))),
            "--out", str(d / "r"))}),
        C("tb report", "report on a non-integer verify-cost width key", lambda d, s: verify_cost_case(d, s)),
        C("tb report", "report --out a file", lambda d, s: out_file_case(d, s)),
        C("tb report", "report --out read-only", full_fs("report", True), words=("permission denied",),
          needs_root=True),
        C("tb report", "report on a missing /file while .benchmarks exists", lambda d, s: {
            "argv": report("/dflash-probe-missing.json"), "cwd": benchmarks_dir(d)}),
        C("tb import", "import with a numeric content_sha256",
          import_case(b("n1", lambda x: x["target"].update(content_sha256=12345))), words=("content_sha256",),
          check=home_unchanged),
        C("tb import", "import into a read-only home", full_fs("import-ro", True), needs_root=True),
        C("tb import", "import --home a file", lambda d, s: home_file_case(d, s, cli("import", str(s[mini])))),
        C("tb export", "export to a full filesystem", full_fs("export", False), words=("no space left on device",),
          needs_root=True),
        C("tb export", "export to a read-only filesystem", full_fs("export", True), words=("permission denied",),
          needs_root=True),
        C("tb export", "export to an existing folder", lambda d, s: export_existing(d, s),
          words=("not a regular file",), check=quick(20)),
        C("tb export", "export-drafter to a read-only filesystem", full_fs("export-drafter", True),
          words=("permission denied",), needs_root=True),
        C("tb export", "export-drafter to a full filesystem", full_fs("export-drafter", False),
          words=("no space left on device",), needs_root=True),
        C("tb drafter", "--drafter without hidden_size", drafter_case(hidden_size=None), words=("hidden_size",)),
        C("tb drafter", "--drafter num_attention_heads 0", drafter_case(num_attention_heads=0),
          words=("num_attention_heads",)),
        C("tb drafter", "--drafter target_layer_ids ['a']", drafter_case(target_layer_ids=["a"]),
          words=("target_layer_ids",)),
        C("tb drafter", "--drafter hidden_size '384x'", drafter_case(hidden_size="384x"), words=("hidden_size",)),
        C("tb home", "DFLASH_HOME a file (run)", lambda d, s: home_file_case(d, s, cli(*run_argv))),
        C("tb home", "DFLASH_HOME a file (prepare)", lambda d, s: home_file_case(d, s, cli("prepare"))),
        C("tb home", "a deeply nested manifest.json", lambda d, s: nested_manifest(d, s), words=("nests deeper",)),
        # more of the probe's own
        imp("extra import", "not a gzip file", lambda d, s: write_bytes(d / "x.tar.gz", os.urandom(4096)),
            ("truncated or corrupt",)),
        imp("extra import", "an empty file", lambda d, s: write_bytes(d / "x.tar.gz", b""), ()),
        imp("extra import", "bundle.json of 10 MB", lambda d, s: write_tar(d / "x.tar.gz", [
            (info("bundle.json"), b" " * (10 << 20))]), ("limit",)),
        imp("extra import", "bundle.json with a NaN literal", lambda d, s: write_tar(d / "x.tar.gz", [
            (info("bundle.json"), b'{"format": NaN}')] + members(s[local])[1:]), ("NaN",)),
        imp("extra import", "a listed file twice", lambda d, s: write_tar(d / "x.tar.gz", members(s[local]) + members(
            s[local])[1:2]), ("duplicate",)),
        imp("extra import", "a FIFO member", b("f1", None, extra=[(info("artifacts/fifo", tarfile.FIFOTYPE), b"")]),
            ("special",)),
        imp("extra import", "unknown top-level key", b("k1", lambda x: x.update(extra=1)), ("beyond or missing",)),
        C("extra report", "report on a width of 10**30", lambda d, s: report_with(d, s, width=10 ** 30)),
        C("extra report", "report on NaN rounds", lambda d, s: {"argv": report(str(saved_with(
            d, s, raw=s["base_run"].read_text().replace("[1.45,", "[NaN,"))), "--out", str(d / "r"))}),
        C("extra run", "--target with auto_map in config.json", lambda d, s: target_with(d, s, auto_map={"x": "y"}),
          words=("auto_map",)),
        C("extra run", "--drafter block_size 10**6", drafter_case(block_size=10 ** 6), words=("block_size",)),
        C("extra run", "--drafter num_key_value_heads 3 (does not divide)", drafter_case(num_key_value_heads=3),
          words=("num_key_value_heads",)),
        C("extra run", "export-drafter --out a file", lambda d, s: export_drafter_file(d, s),
          words=("not an empty directory",)),
        C("extra ok", "a clean import still works", import_case(lambda d, s: s[mini]), expect="ok",
          words=("artifact_dir",)),
        # round three (issue 70)
        C("r3 hangs", "--calibration-from run id -> a FIFO", lambda d, s: calibration_special(d, s, "fifo"),
          words=("FIFO",), check=quick(60)),
        C("r3 hangs", "--calibration-from run id -> /dev/zero", lambda d, s: calibration_special(d, s, "zero"),
          words=("device",), check=quick(60)),
        C("r3 hangs", "a FIFO at <home>/.import-x/journal.json", lambda d, s: journal_fifo(d, s), expect="ok",
          words=("artifact_dir",), check=quick(60)),
        C("r3 lock", ".prepare.lock is a link", lambda d, s: lock_case(d, s, "link"), words=("lock",)),
        C("r3 lock", ".prepare.lock is a FIFO", lambda d, s: lock_case(d, s, "fifo"), words=("lock",),
          check=quick(60)),
        C("r3 lock", ".prepare.lock is a folder", lambda d, s: lock_case(d, s, "dir"), words=("lock",)),
        C("r3 budget", "--bench-budget 1e308", lambda d, s: {"argv": cli("bench", "--smoke"),
                                                              "env": {"DFLASH_BENCH_BUDGET": "1e308"}},
          words=("minutes",)),
        C("r3 env", "DFLASH_REQUIRE_GPU=maybe", lambda d, s: {"argv": cli("prepare"),
                                                            "env": {"DFLASH_REQUIRE_GPU": "maybe"}},
          words=("DFLASH_REQUIRE_GPU",)),
        C("r3 env", "DFLASH_REBUILD_MINI=ture", lambda d, s: {"argv": cli("prepare"),
                                                            "env": {"DFLASH_REBUILD_MINI": "ture"}},
          words=("DFLASH_REBUILD_MINI",)),
        C("r3 seed", "--mini-seed 2**64", lambda d, s: {"argv": cli("prepare", "--mini-seed", str(2 ** 64))},
          words=("--mini-seed",), check=no_seed_folder),
        C("r3 reports", "DFLASH_REPORTS under a file", lambda d, s: reports_under_file(d), words=("report folder",),
          check=quick(60)),
        C("r3 prompts", "a JSONL prompt holding a lone surrogate", lambda d, s: prompts_case(
            d, "p.jsonl", b'{"text": "a\\ud800"}\n'), words=("surrogate",), check=quick(60)),
        C("r3 prompts", "a 5,000-digit integer in a JSONL line", lambda d, s: prompts_case(
            d, "p.jsonl", b'{"text": "a", "n": ' + b"9" * 5000 + b"}\n"), words=("JSON",), check=quick(60)),
        C("r3 prompts", "a JSONL prompt holding U+2028 (valid JSON) passes the check", lambda d, s: prompts_accepted(
            d, "p.jsonl", '{"text": "a\u2028b"}\n'.encode()), words=("report folder",), check=quick(60)),
        C("r3 prompts", "a text prompt with a form feed inside stays one prompt", lambda d, s: prompts_accepted(
            d, "p.txt", b"a\fb\na\nb\n"), words=("report folder",), check=quick(60)),
        C("r3 home", "a link at <home>/artifacts to a folder outside (prepare)",
          lambda d, s: planted_artifacts_link(d, s), words=("link",), check=quick(60)),
        *[C("r3 shards", f"a shard index naming {shard}", lambda d, s, shard=shard: shard_index(d, s, shard),
            words=(word,), check=quick(60)) for shard, word in (("../outside/x.safetensors", "shard"),
                                                                ("/dev/zero", "shard"), ("fifo.safetensors", "FIFO"))],
        C("r3 drafter", "--drafter header claiming 6.7 GB for one weight", lambda d, s: huge_header_drafter(d, s),
          words=("shape",), check=rss_check),
        C("r3 reports", "DFLASH_REPORTS on a read-only filesystem", lambda d, s: reports_read_only(d, s),
          words=("report folder",), check=quick(60), needs_root=True),
    ]
    return L
