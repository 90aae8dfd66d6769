"""Config: the spec's defaults, YAML + environment layering, and checks on what is named."""

from __future__ import annotations

import re

import pytest

from libs.common.config import ConfigError, load_settings


def test_every_spec_default_is_the_specs():
    s = load_settings(None, env={})
    L = s.learning
    assert (L.diary.max_content_chars, L.diary.embed_budget_seconds, L.diary.long_cap_per_seat) == (2000, 2.0, 500)
    assert (L.diary.vector_limit, L.diary.recency_limit) == (50, 50)
    assert (L.fill.interval_seconds, L.fill.requests_per_minute, L.fill.company_bytes_per_minute) == (60, 16, 1_000_000)
    assert L.fill.hold_back_seconds == 3600
    assert L.personal_memory.max_refreshes_per_turn == 3 and L.personal_memory.refresh_ledger_runs == 256
    assert (L.episodes.account_bytes, L.episodes.rewrite_timeout_seconds, L.episodes.rewrite_concurrency) == (
        600,
        30.0,
        4,
    )
    e = L.episode_lifecycle
    assert (e.interval_seconds, e.max_raw_episodes_per_agent, e.non_terminal_max_age_days) == (3600, 500, 14)
    assert (e.tool_free_max_age_days, e.consolidated_grace_days, e.compaction_batch_size) == (90, 30, 200)
    assert (e.compaction_min_age_days, e.compaction_min_cluster_size, e.compacted_max_age_days) == (30, 3, 0)
    assert e.condense_bytes == 280
    k = L.skill_synthesis
    assert (k.min_tool_calls, k.scheduler_enabled, k.cluster_jaccard_threshold, k.cluster_min_size) == (
        5,
        False,
        0.6,
        3,
    )
    assert k.episode_fetch_limit == 200
    r = L.skill_refinement
    assert (r.enabled, r.auto_refine_on_success, r.auto_refine_on_failure) == (True, True, True)
    assert (r.max_body_chars, r.max_versions_kept) == (20_000, 10)
    c = L.skill_curator
    assert (c.interval_hours, c.stale_after_days, c.archive_after_days) == (24, 30, 90)
    # Cross-agent promotion has no off switch in the spec; only clustered synthesis is off by default.
    p = L.promotion
    assert (p.enabled, p.interval_hours, p.min_sibling_count, p.cluster_jaccard_threshold) == (True, 24, 3, 0.6)
    assert (L.prefetch.embed_budget_seconds, L.prefetch.aux_timeout_seconds) == (2.0, 30.0)
    assert s.server.port == 50051 and s.providers.embeddings.kind == "local"
    assert s.providers.auxiliary_chain == ["offline"]


def test_yaml_is_layered_under_the_environment(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("learning:\n  diary:\n    long_cap_per_seat: 42\n    vector_limit: 7\nserver:\n  port: 6000\n")
    monkeypatch.setenv("AGENTLEARN_LEARNING__DIARY__VECTOR_LIMIT", "9")
    s = load_settings(cfg)
    assert s.learning.diary.long_cap_per_seat == 42  # from the file
    assert s.learning.diary.vector_limit == 9  # the environment wins
    assert s.server.port == 6000
    assert s.learning.diary.recency_limit == 50  # untouched default


def test_conventional_environment_names_select_external_infrastructure():
    s = load_settings(
        None,
        env={
            "DATABASE_URL": "postgresql://u:p@db/agentlearn",
            "QDRANT_URL": "http://qdrant:6333",
            "OPENAI_BASE_URL": "http://llm:8000/v1",
            "OPENAI_API_KEY": "sk-test",
        },
    )
    assert s.database_url.get_secret_value() == "postgresql://u:p@db/agentlearn"
    assert s.qdrant_url == "http://qdrant:6333"
    assert s.providers.auxiliary_chain == ["openai", "offline"]
    assert s.providers.llm["openai"].api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(s)  # secrets never print
    assert s.providers.embeddings.kind == "local"  # embeddings move only when asked to


def test_a_chain_naming_an_unknown_provider_is_refused():
    with pytest.raises(ConfigError, match=r"names providers not under providers\.llm"):
        load_settings(None, {"company_defaults": {"roles": {"swe": {"llm_auxiliary": ["nope"]}}}}, env={})


def test_unknown_knobs_are_refused_not_ignored():
    with pytest.raises(ConfigError, match=r"^the configuration: learning\.diary\.long_cap: Extra inputs"):
        load_settings(None, {"learning": {"diary": {"long_cap": 3}}}, env={})


def test_config_errors_are_one_line_naming_the_file_and_the_key(tmp_path):
    """An operator reads one line, not a traceback naming <unicode string> (issue 15)."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("learning:\n  diary:\n    long_cap_per_seat: 5\n   vector_limit: [\n")
    missing = tmp_path / "nope.yaml"
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("learning:\n  diary:\n    long_cap_per_seat: many\n")
    messages = []
    for path in (broken, missing, wrong):
        with pytest.raises(ConfigError) as err:
            load_settings(path, env={})
        messages.append(str(err.value))
    assert all("\n" not in m and m.startswith(str(tmp_path)) for m in messages), messages
    assert "line 4" in messages[0] and "not valid YAML" in messages[0]
    assert "cannot read the config file" in messages[1]
    assert "learning.diary.long_cap_per_seat" in messages[2]


def test_fingerprint_moves_with_model_width_limits_or_endpoint_only():
    base = load_settings(None, env={}).providers.embeddings
    fp = base.fingerprint()
    assert base.model_copy(update={"model": "m2"}).fingerprint() != fp
    assert base.model_copy(update={"dimensions": 128}).fingerprint() != fp
    assert base.model_copy(update={"max_input_tokens": 512}).fingerprint() != fp
    assert base.model_copy(update={"timeout_seconds": 99}).fingerprint() == fp


def test_an_explicit_override_beats_the_environment(monkeypatch):
    """A developer's shell must not change what a test asked for (issue 10: config precedence)."""
    monkeypatch.setenv("AGENTLEARN_LEARNING__DIARY__MAX_CONTENT_CHARS", "7")
    s = load_settings(None, {"learning": {"diary": {"max_content_chars": 300}}})
    assert s.learning.diary.max_content_chars == 300
    # With no override the environment still wins over the default ...
    assert load_settings(None).learning.diary.max_content_chars == 7
    # ... and an explicit ``env`` replaces os.environ entirely.
    assert load_settings(None, env={}).learning.diary.max_content_chars == 2000


def test_environment_values_reach_nested_and_list_knobs():
    s = load_settings(
        None,
        env={
            "AGENTLEARN_PROVIDERS__AUXILIARY_CHAIN": '["offline"]',
            "agentlearn_server__port": "6100",
            "AGENTLEARN_CONFIG": "",
        },
    )
    assert s.providers.auxiliary_chain == ["offline"]
    assert s.server.port == 6100


def test_top_level_keys_match_in_any_case_and_sections_exactly(tmp_path):
    """Settings is a plain pydantic model (issue 14): the file keeps what pydantic-settings' init
    source did with it — a top-level key in another case names its knob (the first one given wins),
    a key inside a section must be spelt as documented, and an unknown key is still refused."""
    config = tmp_path / "agentlearn.yaml"
    config.write_text("Data_Dir: /srv/al\nSERVER:\n  port: 6200\n")
    s = load_settings(config, env={})
    assert (str(s.data_dir), s.server.port) == ("/srv/al", 6200)
    assert str(load_settings(None, {"DATA_DIR": "first", "data_dir": "second"}, env={}).data_dir) == "first"
    with pytest.raises(ConfigError, match=r"server\.Port: Extra inputs are not permitted"):
        load_settings(None, {"server": {"Port": 1}}, env={})
    with pytest.raises(ConfigError, match=r"_env_file: Extra inputs are not permitted"):
        load_settings(None, {"_env_file": ".env"}, env={})


def test_the_configuration_never_imports_pydantic_settings():
    """The process start-up pays for neither pydantic-settings nor python-dotenv (issue 14)."""
    import ast
    import subprocess
    import sys

    probe = "import sys, libs.common.config; print(sorted({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    imported = set(ast.literal_eval(out.stdout))
    assert "pydantic" in imported  # the probe sees the imports
    assert not imported & {"pydantic_settings", "dotenv"}


def test_the_clients_variables_are_not_configuration_but_a_typo_still_is():
    """A shell set up for ``./run mcp`` or the examples (docs/integrating.md) runs ``./run`` too:
    the variables agentlearn's clients read are skipped, and only those."""
    clients = {
        "AGENTLEARN_ADDRESS": "127.0.0.1:50051",
        "AGENTLEARN_TOKEN": "abc",
        "AGENTLEARN_COMPANY": "acme",
        "AGENTLEARN_SEAT": "ada",
        "AGENTLEARN_ROLE": "swe",
        "AGENTLEARN_UNIT_CHAIN": "platform,eng",
        "AGENTLEARN_TLS_CA": "/etc/ca.pem",
        "AGENTLEARN_PROTOS": "/src/protos",
    }
    s = load_settings(None, env={**clients, "AGENTLEARN_SERVER__PORT": "6300"})
    assert s.server.port == 6300
    with pytest.raises(ConfigError, match=r"^the configuration: servr: Extra inputs are not permitted"):
        load_settings(None, env={**clients, "AGENTLEARN_SERVR__PORT": "6300"})
    with pytest.raises(ConfigError, match=r"tokn: Extra inputs are not permitted"):
        load_settings(None, env={"AGENTLEARN_TOKN": "abc"})


def test_the_openai_endpoint_heads_the_configured_chain_instead_of_replacing_it(tmp_path):
    """docs/deploy.md: the Secret's endpoint "goes at the head of the auxiliary chain"."""
    openai = {"OPENAI_BASE_URL": "http://llm:8000/v1", "OPENAI_API_KEY": "sk-test"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "providers:\n  llm:\n    vllm: {kind: openai, base_url: 'http://vllm:8000/v1', model: m}\n"
        "    offline: {kind: offline, model: offline-rules}\n  auxiliary_chain: [vllm, offline]\n"
    )
    s = load_settings(cfg, env=openai)
    assert s.providers.auxiliary_chain == ["openai", "vllm", "offline"]
    assert s.providers.llm["vllm"].base_url == "http://vllm:8000/v1"  # the file's providers stay
    # A chain already naming openai keeps one, at the head.
    cfg.write_text("providers:\n  auxiliary_chain: [offline, openai]\n")
    assert load_settings(cfg, env=openai).providers.auxiliary_chain == ["openai", "offline"]
    # No configured chain: the endpoint with the offline rules behind it.
    assert load_settings(None, env=openai).providers.auxiliary_chain == ["openai", "offline"]
    # An AGENTLEARN_ chain is above both and says the chain exactly.
    explicit = {**openai, "AGENTLEARN_PROVIDERS__AUXILIARY_CHAIN": '["offline"]'}
    assert load_settings(cfg, env=explicit).providers.auxiliary_chain == ["offline"]


def test_every_variable_the_clients_read_is_skipped():
    """The skipped set follows the clients: a name ``./run mcp``, examples/ or clients/ reads that is
    not a knob (no ``__``) must not stop ``./run``."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    names: set[str] = set()
    for directory in ("clients", "examples", "services/mcp"):
        for path in (root / directory).rglob("*"):
            if path.suffix in {".py", ".js", ".ts", ".toml"} and "node_modules" not in path.parts:
                names |= set(re.findall(r"\bAGENTLEARN_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    # ``./run mcp`` builds its names from the flags: _env("unit_chain") -> AGENTLEARN_UNIT_CHAIN.
    names |= {
        f"AGENTLEARN_{flag.upper()}"
        for flag in re.findall(r'_env\("(\w+)"\)', (root / "services/mcp/cli.py").read_text())
    }
    names = {n for n in names if "__" not in n and n != "AGENTLEARN_CONFIG"}
    assert {"AGENTLEARN_ADDRESS", "AGENTLEARN_TOKEN", "AGENTLEARN_UNIT_CHAIN"} <= names  # the scan sees them
    for name in sorted(names):
        load_settings(None, env={name: "x"})  # refused: ConfigError naming the variable


@pytest.mark.parametrize("where", ["company_defaults", "companies.acme"])
def test_a_role_name_that_is_no_identifier_is_refused_naming_the_key(where):
    """A role "Tech Lead" would pass gate 2 and then never get an episode (RecordEpisode files a
    role as an identifier): refused at start, the key and the name in the one line."""
    doc: dict = {"roles": {"swe": {}, "Tech Lead": {}}}
    overrides = {"company_defaults": doc} if where == "company_defaults" else {"companies": {"acme": doc}}
    with pytest.raises(ConfigError, match=rf"^the configuration: {re.escape(where)}\.roles: .*'Tech Lead'"):
        load_settings(None, overrides, env={})
    assert load_settings(None, {"company_defaults": {"roles": {"tech-lead": {}, "qa.lead": {}}}}, env={})


def test_a_budget_window_is_at_least_an_hour_wide():
    """``window_hours: 0`` made the reflector re-claim a budget-deferred turn without pause."""
    with pytest.raises(
        ConfigError, match=r"company_defaults\.token_budget\.window_hours: .*greater than or equal to 1"
    ):
        load_settings(None, {"company_defaults": {"token_budget": {"window_hours": 0}}}, env={})
    assert load_settings(None, {"company_defaults": {"token_budget": {"window_hours": 1}}}, env={})
