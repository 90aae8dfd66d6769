"""Configuration: one YAML file plus environment overrides, read once in ``main()`` and passed down.

Every knob of the spec lives here with the spec's default; ``docs/configuration.md`` lists each one,
its default and the rule behind it. Precedence, highest first: explicit overrides (tests), the
environment (``AGENTLEARN_<SECTION>__<KNOB>``, plus the conventional ``DATABASE_URL``,
``QDRANT_URL``, ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``), the YAML file, the defaults below.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

__all__ = [
    "AuthConfig",
    "BudgetConfig",
    "CompanyConfig",
    "CompanyKnowledgeConfig",
    "ConfigError",
    "ConfluenceConfig",
    "DatabaseConfig",
    "EmbeddingsConfig",
    "KnowledgeConfig",
    "LearningConfig",
    "MemoryConfig",
    "ProviderConfig",
    "RelevanceConfig",
    "RoleConfig",
    "ServerConfig",
    "SessionsConfig",
    "Settings",
    "ToolPermission",
    "UserConfig",
    "load_settings",
    "workspace_container",
]


class _Section(BaseModel):
    # Attribute docstrings become field descriptions: docs/configuration.md is generated from them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# --------------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------------


class EmbeddingsConfig(_Section):
    """``providers.embeddings``: the one embedding model of the deployment."""

    kind: Literal["local", "openai", "none"] = "local"
    """``local``: MiniLM shipped in a PyPI package, run offline; ``openai``: any
    OpenAI-compatible endpoint; ``none``: no embeddings (vector halves do not run)."""
    model: str = "all-MiniLM-L6-v2"
    """Model name stored beside every vector; a vector of another model is never a match."""
    dimensions: int | None = None
    """Requested width (OpenAI ``dimensions``); the local model is fixed at 384."""
    base_url: str | None = None
    """Endpoint of an OpenAI-compatible server (``kind: openai``)."""
    api_key: SecretStr | None = None
    """Key for that endpoint."""
    max_input_tokens: int = 256
    """The model's input; a longer text is split between words and its pieces' vectors pooled."""
    timeout_seconds: float = 10.0
    """Deadline of one embeddings request (the inline write budget is separate and shorter)."""
    model_runs: int = Field(default=2, ge=1, le=64)
    """``local``: model runs side by side, each on one thread of its own (ONNX Runtime with one
    intra-op thread and no spin-waiting): set it to the cores the process may use. A second
    thread inside one run spin-waits on a core the event loop needs and costs more CPU per text
    than it saves."""
    batch_pieces: int = Field(default=256, ge=16, le=65_536)
    """``local``: the padded word-piece budget of one model run. Texts that wait are sorted by
    length and cut into runs of at most this many pieces counted padded (texts × the longest
    text), so everything waiting is embedded together without paying for padding: one run of 16
    short texts padded to the longest costs 3-5× the CPU per text of small runs (docs/perf). A
    text longer than the budget runs alone."""
    batch_max_texts: int = Field(default=32, ge=1, le=1024)
    """``local``: at most this many texts in one model run, however short."""
    query_cache_entries: int = Field(default=4096, ge=0, le=1_000_000)
    """Query vectors kept per process (an LRU keyed by model and a digest of the text, emptied by
    every erasure the process serves: docs/privacy.md; 1.5 KiB each at 384 dimensions): a repeated
    search query — RecallNotes' or SearchEpisodes' server-side embed, the
    prefetch's ask — skips the model. 0 turns the cache off. Stored rows' texts never enter it."""

    def fingerprint(self) -> str:
        """What the fill's holds and pause are about: model, width, limits and endpoint.

        A change of any of the four releases every held note at once (spec: "The holder fills what
        is missing"); a key rotation or any other edit keeps them.
        """
        basis = {
            "model": self.model,
            "dimensions": self.dimensions,
            "max_input_tokens": self.max_input_tokens,
            "endpoint": self.base_url if self.kind == "openai" else self.kind,
        }
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


class ProviderConfig(_Section):
    """One auxiliary-model provider a role's chain can name."""

    kind: Literal["offline", "openai"] = "offline"
    """``offline``: deterministic rules, no model; ``openai``: any OpenAI-compatible endpoint."""
    base_url: str | None = None
    """Endpoint of an OpenAI-compatible server (``kind: openai``)."""
    api_key: SecretStr | None = None
    """Key for that endpoint (never printed)."""
    model: str = "offline-rules"
    """Model name sent to the endpoint and recorded on every ``auxiliary_spend``."""
    timeout_seconds: float = 30.0
    """Deadline of one completion; a timeout falls back along the chain."""


def _default_llm_providers() -> dict[str, ProviderConfig]:
    return {"offline": ProviderConfig(kind="offline", model="offline-rules")}


class ProvidersConfig(_Section):
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    """The embeddings seam (DESIGN: "Embeddings")."""
    llm: dict[str, ProviderConfig] = Field(default_factory=_default_llm_providers)
    """Named auxiliary-model providers. Empty means no auxiliary model is configured anywhere."""
    auxiliary_chain: list[str] = Field(default_factory=lambda: ["offline"])
    """The default ``llm_auxiliary`` chain for roles that do not name their own."""


# --------------------------------------------------------------------------------------------
# Company, roles, budgets
# --------------------------------------------------------------------------------------------


ToolPermission = Literal["allow", "ask", "deny"]
"""What a role may do with a tool: ``allow`` runs it, ``ask`` needs a person's approval first,
``deny`` never runs it. A background worker has nobody to ask, so only ``allow`` lets it write."""
TOOL_PERMISSIONS = ("allow", "ask", "deny")


def _permissions(value: dict[str, str]) -> dict[str, str]:
    # Kept as plain strings in the model (the generated docs list dict values by type) and checked
    # here, so a typo is refused at start rather than read as "not allow".
    bad = {tool: p for tool, p in value.items() if p not in TOOL_PERMISSIONS}
    if bad:
        raise ValueError(f"tool permissions must be one of {list(TOOL_PERMISSIONS)}: {bad}")
    return value


WORKSPACE_CONTAINER_PREFIX = "workspace:"


def workspace_container(workspace: str) -> str:
    """The knowledge container a workspace's project lessons live in (``workspace:<name>``): the
    session learning checks write there and every role listing the workspace reads it."""
    return f"{WORKSPACE_CONTAINER_PREFIX}{workspace}"


class RoleConfig(_Section):
    learning_enabled: bool | None = None
    """Per-role opt-out (reflector gate 3). Unset inherits ``learning.enabled``."""
    llm_auxiliary: list[str] | None = None
    """The role's auxiliary provider chain (names under ``providers.llm``); unset inherits
    ``providers.auxiliary_chain``."""
    knowledge_containers: list[str] = Field(default_factory=list)
    """Knowledge containers (spaces) the role may read; empty means none."""
    unit: str | None = None
    """The unit (team) the role belongs to."""
    workspaces: list[str] = Field(default_factory=list)
    """Workspaces whose project lessons the role reads: each adds the knowledge container
    ``workspace:<name>`` to ``knowledge_containers`` (session learning: "Project lessons become
    workspace-scoped, indexed notes", searchable by every seat of the workspace)."""
    tool_permissions: dict[str, str] = Field(default_factory=dict)
    """The role's permission per tool (``allow`` / ``ask`` / ``deny``), over
    ``sessions.default_tool_permissions``. Session learning rechecks ``write_knowledge`` before a
    project lesson and ``distill_skill`` before a skill proposal; the background worker cannot
    approve ``ask`` or ``deny`` (spec: "Knowledge and skill writes recheck the corresponding tool
    permission")."""

    _check_permissions = field_validator("tool_permissions")(_permissions)


class BudgetConfig(_Section):
    """``token_budget``: ceilings on auxiliary tokens per window. ``None`` means no ceiling."""

    seat_ceiling_tokens: int | None = None
    """A seat's auxiliary tokens per window; at the ceiling the reflector's budget gate skips."""
    company_ceiling_tokens: int | None = None
    """The company's auxiliary tokens per window (all seats)."""
    window_hours: int = Field(default=24, ge=1)
    """Width of a budget window, at least one hour; every call is charged in the window current when
    it returns."""


ExtractionCadence = Literal["on", "off"]


class MemoryConfig(_Section):
    """``memory``: how personal memory is extracted for a company or one of its users."""

    extraction_cadence: ExtractionCadence | None = None
    """memory.extractionCadence: ``off`` stops personal-memory writes, the session learning checks'
    personal facts included (spec: "memory.extractionCadence=off also disables personal memory
    writes from learning checks"); unset inherits (user → company → ``on``). YAML's bare
    ``off``/``on`` are read as the words, not as booleans."""

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false: the knob means the word.
        if isinstance(data, dict) and isinstance(data.get("extraction_cadence"), bool):
            data = {**data, "extraction_cadence": "on" if data["extraction_cadence"] else "off"}
        return data


class UserConfig(_Section):
    """One user of a company (the person who owns chat sessions)."""

    default_workspace: str | None = None
    """The workspace of the user's sessions that name none (spec: "Unscoped sessions use the user's
    default workspace for saved learning"); unset: ``sessions.default_workspace``."""
    memory: MemoryConfig = MemoryConfig()
    """The user's own ``memory`` knobs, over the company's."""


class CompanyKnowledgeConfig(_Section):
    """``companies.<c>.knowledge``: who reads which knowledge containers, and where a unit's drafts go
    (spec: "Relevant-knowledge prefetch", "Cross-agent promotion is the third path")."""

    scope: list[str] = Field(default_factory=list)
    """knowledge.scope: containers (Confluence space keys, native containers) every seat of the
    company may read. The search is narrowed to them (``space IN (...)``) beside the role's own
    ``knowledge_containers`` and the seat's ``seat_containers``."""
    seat_containers: dict[str, list[str]] = Field(default_factory=dict)
    """Per-seat read permission on the native backend: containers one seat may read besides the
    company scope and its role's (by seat handle)."""
    seat_credentials: dict[str, SecretStr] = Field(default_factory=dict)
    """Per-seat Confluence credentials by seat handle (the seat's own backend user): the search and
    page reads run as that account, so Confluence's page permissions apply; a seat without one
    falls back to ``knowledge.confluence.token``. ``user:api-token`` is sent as Basic auth (Cloud),
    anything else as a Bearer personal access token (Data Center). A seat with its own credential
    may search unscoped when no container names its reading."""
    unit_containers: dict[str, str] = Field(default_factory=dict)
    """A unit's wiki space (its container key) by unit name: where cross-agent promotion files the
    unit's drafts (under its "Auto-Drafted Skills" page) and where its Onboarding pages are read. A
    unit not listed is soft-skipped by promotion (the log names this key); its onboarding pages are
    read from the container named like the unit."""


ROLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")
"""A role's name: the identifier rule every service holds a role to (SubmitTurn's ``turn.role``, the
episode's ``role``): letters, digits and ``._:@/-``, at most 200, no space."""


def _role_names(value: dict[str, RoleConfig]) -> dict[str, RoleConfig]:
    # A role named "Tech Lead" would pass gate 2 and then be refused by every service that files a
    # row under the role (no episode, ever): refused at start, naming the key, instead.
    bad = [name for name in value if not ROLE_NAME.match(name)]
    if bad:
        raise ValueError(f"role names must be identifiers (letters, digits, . _ : @ / -, at most 200, no space): {bad}")
    return value


class CompanyConfig(_Section):
    roles: dict[str, RoleConfig] = Field(default_factory=dict)
    """Roles of the company by name. A turn of a role not listed closes the reflector's "no role"
    gate (spec gate 2: learning about a renamed or removed role writes memory under an identity
    nothing can read back), unless ``accept_unknown_roles``. A name is an identifier (letters,
    digits and ``._:@/-``, at most 200, no space: ``Tech Lead`` is refused at start), the rule
    SubmitTurn holds ``turn.role`` to."""
    accept_unknown_roles: bool = False
    """True: a role not listed under ``roles`` behaves as a default role, and gate 2 never closes.
    Off by default, so a company lists the roles it has."""
    token_budget: BudgetConfig = BudgetConfig()
    """Spec "What the auxiliary calls cost"."""
    memory: MemoryConfig = MemoryConfig()
    """The company's ``memory`` knobs (``extraction_cadence``); a user's own override them."""
    users: dict[str, UserConfig] = Field(default_factory=dict)
    """Per-user knobs by user handle (default workspace, ``memory``)."""
    knowledge: CompanyKnowledgeConfig = CompanyKnowledgeConfig()
    """Knowledge read scope, per-seat permissions and credentials, units' containers."""

    _check_role_names = field_validator("roles")(_role_names)

    def extraction_cadence(self, user: str) -> ExtractionCadence:
        """The user's cadence, else the company's, else ``on``."""
        own = self.users.get(user)
        if own is not None and own.memory.extraction_cadence is not None:
            return own.memory.extraction_cadence
        return self.memory.extraction_cadence or "on"


# --------------------------------------------------------------------------------------------
# Learning knobs (the spec's ``learning:`` block)
# --------------------------------------------------------------------------------------------


class DiaryConfig(_Section):
    max_content_chars: int = 2000
    """learning.MaxContentChars: a longer note is refused, never trimmed."""
    embed_budget_seconds: float = 2.0
    """learning.DiaryEmbedBudget: inline embed deadline; past it the note is stored without."""
    long_cap_per_seat: int = 500
    """LONG notes kept per seat; past it the sweep evicts least-used, then least-recently-used,
    then oldest."""
    vector_limit: int = 50
    """memoryVectorLimit: vector top-K of the candidate pool."""
    recency_limit: int = 50
    """memoryRecencyLimit: recency top-K of the candidate pool."""
    lexical_limit: int = 50
    """Beyond the spec: full-text top-K of the candidate pool (0 switches it off)."""
    neighbour_limit: int = 10
    """Beyond the spec: how many of the pool's best vector / lexical hits (by the fused score: the
    similarity min-max over the vector hits plus the lexical rank over the best, equal weights) bring
    the seat's note written just before and just after each — one indexed read. A fact is stated,
    qualified and dated across adjacent notes (one reflection writes its notes together; an exchange
    runs over consecutive turns), so a hit's neighbours carry what the hit alone does not say. 10:
    the notes the ``## Personal memory`` block can show (MEMORY_BLOCK_NOTES), not a fitted figure.
    0 switches the half off. Measured on LoCoMo dev only (docs/services/diary.md)."""
    max_recall_limit: int = 500
    """Largest K a caller may ask for per half."""
    sweep_interval_seconds: int = 3600
    """Cadence of the retention sweep (expired SHORT notes, LONG cap) in the all-in-one."""


class FillConfig(_Section):
    """The vector fill pass shared by diary notes and episodes."""

    interval_seconds: int = 60
    """Once a minute."""
    requests_per_minute: int = 16
    """Requests the fills may send a minute, refused ones included (spec: "sixteen requests a
    node"): one count in PostgreSQL (``fill_requests``) shared by every process on the database, so
    the diary, episode and knowledge fills of separate pods share one minute and one provider's
    "not now"."""
    company_bytes_per_minute: int = 1_000_000
    """Bytes of text a minute across the whole company: one ledger in Postgres shared by every
    runner and by both row families (notes and episodes)."""
    hold_back_seconds: int = 3600
    """A refused note, an unusable vector, or a refused configuration waits this long."""
    batch_size: int = 64
    """Texts per embeddings request."""
    probe_word: str = "hello"
    """The plain word that judges a minute's first refusal."""


class PersonalMemoryConfig(_Section):
    max_refreshes_per_turn: int = 3
    """learning.personal_memory.max_refreshes_per_turn."""
    refresh_ledger_runs: int = 256
    """Refresh state kept for the newest N run ids of each seat."""


class EpisodesConfig(_Section):
    embed_budget_seconds: float = 2.0
    """An episode's inline embed has the diary's two-second budget; past it the row is stored
    without a vector and the fill embeds it."""
    search_limit: int = 10
    """Default vector top-K of SearchEpisodes (the lexical half adds up to as many again)."""
    account_bytes: int = 600
    """learning.EpisodeAccountBytes: an ask or account past it is condensed when shown."""
    rewrite_timeout_seconds: float = 30.0
    """learning.EpisodeRewriteTimeout: one deadline shared by every rewrite of one answer."""
    rewrite_concurrency: int = 4
    """Rewrites run at once."""
    similar_prior_work_limit: int = 3
    """Hits of the ``## Similar prior work`` block."""
    summary_input_bytes: int = 11_000
    """Past this an ask or account is condensed before the briefing (a sixth of one call's input)."""


class EpisodeLifecycleConfig(_Section):
    interval_seconds: int = 3600
    """Hourly."""
    max_raw_episodes_per_agent: int = 500
    """When a pass is due for a seat (not a cap)."""
    non_terminal_max_age_days: int = 14
    """Drop ``self_iterate`` rows older than this (a mid-state only feeds recall as noise)."""
    tool_free_max_age_days: int = 90
    """Drop rows that called no tool older than this (nothing can fold them); reported alone as
    ``tool_free_dropped``."""
    consolidated_grace_days: int = 30
    """Drop rows a skill was drafted from after this grace (time to audit the consolidation)."""
    compaction_batch_size: int = 200
    """The oldest foldable raw rows one pass clusters."""
    compaction_min_age_days: int = 30
    """Only rows older than this are folded."""
    compaction_min_cluster_size: int = 3
    """A cluster folds into a compacted row from this size."""
    compaction_jaccard_threshold: float = 0.6
    """Greedy tool-sequence Jaccard threshold of the compaction clusters (the spec gives none; the
    clustered synthesis pass's pooling threshold is used)."""
    compacted_max_age_days: int = 0
    """0 disables the eviction of compacted rows."""
    condense_bytes: int = 280
    """A member's task or outcome past this is condensed before the summary call."""
    rewrite_concurrency: int = 4
    """Condensations run at once during compaction."""


class SkillSynthesisConfig(_Section):
    min_tool_calls: int = 5
    """A turn is skill-worthy from this many tool calls (Hermes's default)."""
    max_skills_per_agent: int = 50
    """Per-seat catalogue cap (the spec names the knob without a default; 50 chosen)."""
    duplicate_jaccard_threshold: float = 0.8
    """Tool-SET Jaccard at or above which a candidate duplicates a live skill (stricter than the
    pooling threshold on purpose; the spec gives no number, 0.8 chosen)."""
    scheduler_enabled: bool = False
    """Clustered synthesis is off by default (an auxiliary call per seat per day)."""
    scheduler_interval_seconds: int = 86400
    """Daily."""
    cluster_jaccard_threshold: float = 0.6
    """Pooling threshold: "is this the same kind of work"."""
    cluster_min_size: int = 3
    """The smallest cluster a skill is drafted from."""
    episode_fetch_limit: int = 200
    """A seat's most recent raw settled turns read per pass."""


class SkillRefinementConfig(_Section):
    enabled: bool = True
    """False refuses RefineSkill and leaves the auto refiner unwired."""
    auto_refine_on_success: bool = True
    """Append ``Observed in practice:`` bullets after done turns."""
    auto_refine_on_failure: bool = True
    """Append ``Counter-example:`` bullets after failed turns (both false: the auto path is off and
    the refiner unbuilt; manual refine_skill still answers to ``enabled``)."""
    max_body_chars: int = 20_000
    """A body past this is refused (manual) or skipped (auto), never truncated."""
    max_versions_kept: int = 10
    """Refinement history kept per skill."""


class SkillCuratorConfig(_Section):
    interval_hours: int = 24
    """Daily: the transitions are measured in tens of days."""
    stale_after_days: int = 30
    """active → stale when unused (not offered, not loaded) this long."""
    archive_after_days: int = 90
    """stale → archived when unused this long; widened to the stale window if inside it."""


class PromotionConfig(_Section):
    enabled: bool = True
    """Cross-agent promotion: a daily pass drafts a knowledge page under a unit's "Auto-Drafted
    Skills" parent when its seats converge on one tool run. On by default: the spec gives it no off
    switch (only clustered synthesis is off by default), and a unit with no knowledge container is
    soft-skipped, so an install with no units configured drafts nothing. False is the operator's
    off switch (an auxiliary call per converging unit per day)."""
    interval_hours: int = 24
    """Daily."""
    min_sibling_count: int = 3
    """Distinct seats of one unit that must converge (the spec gives no number; 3 chosen)."""
    cluster_jaccard_threshold: float = 0.6
    """Tool-set Jaccard at which two runs (of any seats of the unit) are the same kind of work, as
    clustered synthesis pools a seat's own turns."""


class PrefetchConfig(_Section):
    embed_budget_seconds: float = 2.0
    """prefetch.EmbedBudget: the ask is embedded once under this budget."""
    aux_timeout_seconds: float = 30.0
    """prefetch.AuxTimeout: everything one block asks a model, past the recall."""
    skills_char_budget: int = 4000
    """Characters of the skills menu; a skill whose line does not fit is not offered."""
    knowledge_results: int = 5
    """Pages the ``## Relevant knowledge`` block renders, and ``search_knowledge`` returns when the
    model gives no ``limit`` (its schema's default; at most 20, the tool's maximum)."""
    frozen_context_hours: int = 24
    """BuildTurnContext is frozen per run id (spec: "Frozen at turn start"): the rendered context of
    (company, seat, turn_id) is kept this long after it was built, so every later call for the run —
    a self_iterate round, a retry, another replica — gets the same blocks with no model call and no
    note use counted again. A run id asked after this is built afresh."""


class ReflectionConfig(_Section):
    workers: list[str] = Field(
        default_factory=lambda: ["persist_decider", "episodist", "profiler", "skill_use", "synthesizer", "refiner"]
    )
    """The workers wired; empty closes the "no workers" gate. A turn's workers run side by side; the
    order is the record's, and decides which of the episodist and the synthesizer runs first (the
    synthesizer stamps the turn's episode). The refiner is left unbuilt when
    ``skill_refinement.enabled`` is false or both auto flags are."""
    concurrency: int = 4
    """Turns one process reflects at once. Measured (``./run bench reflector``, quiet, 2 cores):
    1 at once 27 turns/s, 4 at once 40 (×1.46), 16 at once 41: four keeps both cores busy while
    one turn waits on a commit or a model run; more only queue."""
    poll_interval_seconds: float = 5.0
    """Backstop poll of the queue; a submit wakes the workers at once through LISTEN/NOTIFY."""
    claim_lease_seconds: float = 30.0
    """A claimed turn is another worker's to take if its holder stops renewing for this long (a
    crashed process): nothing is lost, and a redo writes nothing twice (idempotent receivers)."""
    budget_recheck_seconds: float = 300.0
    """A turn deferred by the budget gate is looked at again this often (and at the next window)."""
    rpc_timeout_seconds: float = 10.0
    """Deadline of every call a worker makes on another service (the channel's own retries of an
    unavailable or overloaded service happen inside it)."""
    max_attempts: int = 8
    """Attempts at a turn before it is dead-lettered (``REFLECTION_STATE_DEAD_LETTERED``, its reason
    kept) while a worker keeps failing for a passing reason: a service unavailable, out of time or
    shedding load; the auxiliary model rate-limited, timing out, erroring or unreachable. An attempt
    is one pass of the turn, and one whose claim lapsed (a crash) counts; a budget deferral does
    not. Each attempt runs only the workers that have not finished."""
    retry_backoff_seconds: float = 15.0
    """Wait before the second attempt after a passing fault; it doubles with each attempt (with the
    defaults a turn keeps being retried for about half an hour of outage)."""
    retry_backoff_max_seconds: float = 900.0
    """Longest wait between two attempts."""
    recent_notes_shown: int = 50
    """Recent notes the persist decider is shown and told not to repeat (Diary.Recent, up to 50)."""


class SkillProposalsConfig(_Section):
    """Skill proposals: candidates (from session learning checks and ``distill_skill``) that wait
    for a person's approval before they become live skills."""

    duplicate_similarity_threshold: float = 0.85
    """Cosine similarity of two skills' "name: summary" embeddings at or above which a candidate is
    a semantic duplicate (of a live skill, of a pending proposal) or is suppressed (by a rejected
    proposal). Applied only where an embedder is configured; the tool-SET Jaccard check
    (``skill_synthesis.duplicate_jaccard_threshold``) runs whenever the candidate names its tools.
    The spec gives no number; 0.85 chosen on the local MiniLM, where paraphrased skill names score
    about 0.85 to 0.95 and different procedures below 0.7."""
    page_size: int = 50
    """Default page of ListSkillProposals (at most 200)."""


MEASURED_RELEVANCE_FLOORS: dict[str, float] = {"all-MiniLM-L6-v2": 0.42}
"""Relevance floors measured on the dev data (``./run bench relevance_floor``; docs/services/episodes.md,
"The relevance floor"):
the 99.8th percentile of the cosine similarity of unrelated LoCoMo pairs (a question and the turns
of other conversations), i.e. at most one unrelated row in 500 — a full seat's rows of one kind —
clears it. all-MiniLM-L6-v2: unrelated p99.8 = 0.424; 63 % of question-evidence pairs clear it."""


class RelevanceConfig(_Section):
    """``learning.relevance``: when a vector hit counts as related at all."""

    floors: dict[str, float] = Field(default_factory=dict)
    """Per embedding model (the name stored beside every vector): the cosine similarity below which
    a hit is not related — ``## Similar prior work``, ``query_episodes`` and the diary's vector half
    never offer it, so an unrelated turn is not shown as similar and "this is new work" can be said.
    A model not listed here takes its measured floor (``all-MiniLM-L6-v2``: 0.42, measured with
    ``./run bench relevance_floor`` on the dev data); a model with no measured floor has none (every
    top-K hit is kept) until one is measured and set here; ``0`` switches a model's floor off."""

    def floor(self, model: str | None) -> float | None:
        """The floor of ``model``'s similarities, or None when it has none."""
        if not model:
            return None
        value = self.floors.get(model, MEASURED_RELEVANCE_FLOORS.get(model))
        return value if value else None


class LearningConfig(_Section):
    enabled: bool = True
    """Company-wide learning switch; a role's ``learning_enabled`` inherits it."""
    summarize_episodes: bool = True
    """learning.summarize_episodes: the ``## Similar prior work`` hits become one briefing."""
    summarize_max_tokens: int = 400
    """Cap of that briefing (the spec names the knob without a default; 400 chosen)."""
    diary: DiaryConfig = DiaryConfig()
    fill: FillConfig = FillConfig()
    personal_memory: PersonalMemoryConfig = PersonalMemoryConfig()
    episodes: EpisodesConfig = EpisodesConfig()
    relevance: RelevanceConfig = RelevanceConfig()
    """When a similarity hit is related at all: a floor per embedding model."""
    episode_lifecycle: EpisodeLifecycleConfig = EpisodeLifecycleConfig()
    skill_synthesis: SkillSynthesisConfig = SkillSynthesisConfig()
    skill_refinement: SkillRefinementConfig = SkillRefinementConfig()
    skill_curator: SkillCuratorConfig = SkillCuratorConfig()
    promotion: PromotionConfig = PromotionConfig()
    prefetch: PrefetchConfig = PrefetchConfig()
    reflection: ReflectionConfig = ReflectionConfig()
    """The reflector's harness."""
    skill_proposals: SkillProposalsConfig = SkillProposalsConfig()
    """Skill proposals awaiting approval (session learning, ``distill_skill``)."""


# --------------------------------------------------------------------------------------------
# Session learning (spec/session-learning.txt)
# --------------------------------------------------------------------------------------------


class EvidenceConfig(_Section):
    """What one learning check may read (spec "Evidence and cost")."""

    max_chat_messages: int = 8
    """Chat messages (user and assistant) recorded at or before the trigger, newest kept."""
    max_verification_records: int = 8
    """Verification records at or before the trigger, newest kept."""
    max_execution_events: int = 100
    """Execution events (tool requests and tool results) at or before the trigger, newest kept."""
    excerpt_chars: int = 2400
    """Each excerpt is redacted, then capped at this many characters."""
    total_chars: int = 40_000
    """All excerpts of one check together; older records are omitted once it is spent. The
    milestone's plan comes first (its newly done steps before the rest) and takes at most half, so
    the newest records always have room (spec: "Older records may be omitted")."""


class SubstantialTurnConfig(_Section):
    """When a successful turn is substantial enough to check (spec "Triggers")."""

    min_tool_results: int = 6
    """At least this many tool-result events since the turn's start or its last check."""
    min_duration_seconds: int = 120
    """Or at least this long (since the turn's start or its last check) with a recorded result."""


class SessionsConfig(_Section):
    """Session learning checks: the durable queue's worker, the evidence bounds, the review call,
    the writes and the receipts (spec/session-learning.txt)."""

    poll_interval_seconds: float = 15.0
    """The worker polls the queue this often (spec: "The worker polls every 15 seconds");
    LISTEN/NOTIFY wakes it sooner when a check is queued."""
    claim_lease_seconds: float = 30.0
    """A claimed check's lease, renewed while it runs. A check whose lease lapses (its process
    died) is reported ``interrupted`` and never replayed on its own."""
    concurrency: int = 2
    """Checks one process runs at once."""
    evidence: EvidenceConfig = EvidenceConfig()
    """Evidence bounds of one check."""
    substantial_turn: SubstantialTurnConfig = SubstantialTurnConfig()
    """The substantial-turn trigger's thresholds."""
    list_default: int = 30
    """ListLearningChecks' default page: the latest 30 checks (spec "Visibility")."""
    list_max: int = 100
    """The largest page ListLearningChecks and GetAwayDigest return."""
    review_max_tokens: int = 2000
    """The one review call's answer budget; an answer cut at it is ``truncated output``."""
    review_timeout_seconds: float = 120.0
    """One deadline for the review call along the whole provider chain."""
    max_lessons: int = 5
    """Project lessons one check may write; further ones are dropped with a reason."""
    max_personal_facts: int = 5
    """Personal facts one check may write; further ones are dropped with a reason."""
    lesson_max_chars: int = 2000
    """A project lesson longer than this is dropped, never trimmed."""
    personal_fact_duplicate_similarity: float = 0.9
    """A personal fact whose embedding is at least this similar to a note the seat already has
    reuses that note instead of writing another (the embedding-backed dedup; 0.9 chosen:
    near-verbatim restatements score above it on the local MiniLM, related facts below)."""
    default_workspace: str = "default"
    """The workspace of a session that names none, for users without their own
    ``companies.<c>.users.<u>.default_workspace``."""
    default_tool_permissions: dict[str, str] = Field(
        default_factory=lambda: {"write_knowledge": "allow", "distill_skill": "allow"}
    )
    """Permission per tool (``allow`` / ``ask`` / ``deny``) for roles that do not set their own
    (``roles.<r>.tool_permissions``); both tools default to ``allow`` (a proposal still waits for a
    person); a tool listed nowhere is ``allow``."""

    _check_permissions = field_validator("default_tool_permissions")(_permissions)
    rpc_timeout_seconds: float = 10.0
    """Deadline of every call a check makes on another service (diary, skills, knowledge)."""


class InspectorConfig(_Section):
    """The learning inspector: web pages on the HTTP port (``/inspector/``) that read and curate
    what the seats learned through the services' RPCs (docs/inspector.md)."""

    rpc_timeout_seconds: float = 10.0
    """Deadline of every call a page makes on a service."""
    page_size: int = Field(default=25, ge=1, le=200)
    """Rows on one page of every list."""
    search_scan_pages: int = Field(default=20, ge=1, le=200)
    """A search the owning service cannot run itself (skills, profiles, reflections by text) reads
    at most this many of the service's pages per request, then offers to search further."""
    seats_scan_limit: int = Field(default=10_000, ge=100)
    """The company page merges the seats the event log and the episodes know, up to this many; past
    it the page says the list is cut."""
    days: int = Field(default=30, ge=1, le=400)
    """The window of the charts over time (prefetch hit rates, auxiliary spend, tokens per seat)."""
    session_hours: float = Field(default=12.0, gt=0)
    """How long the sign-in cookie lives in the browser (the token's own expiry still applies)."""
    cookie_secure: Literal["auto", "always", "never"] = "auto"
    """The ``Secure`` flag of the inspector's cookies: ``auto`` sets it when the request came over
    HTTPS (directly, or ``X-Forwarded-Proto`` from a proxy uvicorn trusts); ``always`` behind a
    TLS-terminating proxy it does not trust."""


# --------------------------------------------------------------------------------------------
# Infrastructure
# --------------------------------------------------------------------------------------------


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    """Bind address of the gRPC server and of the HTTP server. Any address but loopback needs
    ``auth.mode: tokens``."""
    port: int = 50051
    """gRPC port of the all-in-one (``--port``)."""
    http_port: int = 8080
    """HTTP port (``--http-port``) of the services that serve HTTP (the sessions API); 0 picks a
    free port."""
    grace_seconds: float = 5.0
    """Drain time on shutdown after health reports NOT_SERVING."""
    max_concurrent_rpcs: int = Field(default=1000, ge=1)
    """Calls one server runs at once; past it a call is refused at once with RESOURCE_EXHAUSTED
    (reason ``SERVER_OVERLOADED``) and a retry hint, instead of queueing until its deadline. Health
    checks and reflection are never refused. In the all-in-one a turn's inner calls (the prefetch
    reading the diary...) count too."""
    max_concurrent_rpcs_per_company: int = Field(default=200, ge=1)
    """Calls one company (the request's ``company``) runs at once on one server; past it that
    company's calls are refused (reason ``COMPANY_OVERLOADED``) while other companies are served."""
    tls_cert: Path | None = None
    """PEM certificate chain of the public port (``--tls-cert``), served on the HTTP port too (the
    sessions API, the inspector, /metrics); unset serves both in plaintext. The pass worker's HTTP
    port (/healthz, /metrics only) stays plaintext."""
    tls_key: Path | None = None
    """PEM private key of that certificate (``--tls-key``)."""
    internal_port: int | None = None
    """A second listener for calls between services, mutual TLS only (Kubernetes: 50052). Unset:
    services call each other on the public port with the deployment's internal secret."""
    internal_tls_cert: Path | None = None
    """PEM certificate this service presents on the internal listener."""
    internal_tls_key: Path | None = None
    """Its private key."""
    internal_tls_ca: Path | None = None
    """PEM CA that signs every service's certificate; a client certificate it did not sign is
    refused at the handshake."""


class DatabaseConfig(_Section):
    """``database``: how each process uses PostgreSQL (the URL itself is ``database_url``)."""

    pool_size: int = Field(default=10, ge=1)
    """Connections one process keeps at most. Behind PgBouncer, size the pooler for
    replicas x pool_size."""
    statement_cache_size: int = Field(default=100, ge=0)
    """asyncpg's prepared-statement cache per connection; 0 for PgBouncer in transaction mode,
    which cannot keep a prepared statement across transactions."""
    listen_url: SecretStr | None = None
    """Where the queue's workers LISTEN for wake-ups (a session-mode connection). Unset: the
    database URL. Behind PgBouncer in transaction mode LISTEN does not work: point this at
    PostgreSQL directly (or a session-mode pool); without it the workers still poll."""
    migrate_on_start: bool = True
    """Apply pending migrations when a process starts (the all-in-one). False (Kubernetes): a
    ``./run migrate`` Job applies them with DDL rights, and a service whose schema is behind refuses
    to start with one line instead of needing those rights itself."""


class AuthConfig(_Section):
    """Caller authentication (docs/security.md)."""

    mode: Literal["auto", "tokens"] = "auto"
    """``auto``: local mode (no tokens, every caller trusted, said in the ready line) when the server
    binds only loopback, and a refusal to start on any other address; ``tokens``: every call needs
    a bearer token issued by ``./run token issue`` (``--require-auth``)."""
    cache_seconds: float = 10.0
    """Verified tokens are cached this long per process: a revocation takes effect within it."""
    internal_secret: SecretStr | None = None
    """The secret services present to each other on the public port (all-in-one, split mode).
    Unset: a random one per process (split mode hands the parent's to its children)."""
    page_token_secret: SecretStr | None = None
    """Key of the HMAC-SHA256 that signs page tokens (a forged or edited token is refused). Unset:
    a random key created once and kept in Postgres (``deployment_keys``), so every replica and
    every restart agrees. Rotating it invalidates the page tokens in flight (the caller starts its
    listing over). Environment: ``AGENTLEARN_AUTH__PAGE_TOKEN_SECRET``."""


class RetentionConfig(_Section):
    """``privacy.retention`` (and per company under ``privacy.companies.<company>``): the longest a
    learned row is kept, in days; 0 keeps it until something else removes it. The existing passes
    enforce it (the diary sweep, the episode lifecycle, the reflector's records prune)."""

    note_max_age_days: int = 0
    """Diary notes (LONG and SHORT) older than this are deleted by the diary sweep."""
    episode_max_age_days: int = 0
    """Episodes (raw and compacted) older than this are deleted by the episode lifecycle."""
    reflection_max_age_days: int = 0
    """Reflection records, and the finished reflection jobs holding their turns, older than this
    are deleted by the reflector's records prune."""


class PrivacyConfig(_Section):
    """The privacy service (docs/privacy.md): erasures as durable jobs, their audit, and retention."""

    poll_interval_seconds: float = 5.0
    """The erasure worker polls the queue this often; LISTEN/NOTIFY wakes it sooner."""
    claim_lease_seconds: float = 30.0
    """A claimed erasure's lease, renewed while it runs. An erasure whose process died is taken
    again when its lease lapses and resumes where it stopped (each owner erases once per erasure)."""
    rpc_timeout_seconds: float = 120.0
    """Deadline of one owner's EraseRows / FindRows call."""
    max_attempts: int = 10
    """Claims of one erasure before it is reported failed (an owner that keeps failing)."""
    retry_seconds: float = 30.0
    """Wait before an erasure an owner failed is tried again."""
    cache_poll_seconds: float = Field(default=5.0, gt=0)
    """How often a serving process reads the count of erasures to empty its caches of people's
    text (query vectors, note words) when an erasure another replica ran moved it: the backstop of
    the LISTEN notice it hears at once (issue 17: nothing of an erased person's text outlives the
    erasure in memory), which a lost connection or PgBouncer in transaction mode does not carry."""
    orphan_sweep_interval_seconds: float = 3600.0
    """The all-in-one's cadence of the orphan sweeps (``diary-orphans``, ``episode-orphans``,
    ``knowledge-orphans``): index points whose row is gone from PostgreSQL are removed."""
    prune_interval_seconds: float = 3600.0
    """The all-in-one's cadence of the reflector's records prune (``reflection-prune``), which
    enforces ``reflection_max_age_days``."""
    retention: RetentionConfig = RetentionConfig()
    """Retention for every company not listed in ``companies``."""
    companies: dict[str, RetentionConfig] = Field(default_factory=dict)
    """Per-company retention, by company handle (replaces ``retention`` for that company)."""

    def retention_of(self, company: str) -> RetentionConfig:
        return self.companies.get(company, self.retention)


class ServiceAddresses(_Section):
    """Where each service listens when it runs as its own process (split mode, Kubernetes), and the
    client certificate a service presents when it calls another over mutual TLS."""

    tls_cert: Path | None = None
    """PEM client certificate for calls to other services (Kubernetes: the internal listener)."""
    tls_key: Path | None = None
    """Its private key."""
    tls_ca: Path | None = None
    """PEM CA that signs the other services' server certificates."""

    diary: str = "127.0.0.1:50061"
    """DiaryService."""
    episodes: str = "127.0.0.1:50062"
    """EpisodeService."""
    skills: str = "127.0.0.1:50063"
    """SkillService."""
    profiles: str = "127.0.0.1:50064"
    """ProfileService."""
    reflector: str = "127.0.0.1:50065"
    """ReflectorService."""
    prefetch: str = "127.0.0.1:50066"
    """PrefetchService."""
    sessions: str = "127.0.0.1:50067"
    """SessionService."""
    knowledge: str = "127.0.0.1:50068"
    """KnowledgeService (agentlearn.knowledge.v1)."""
    telemetry: str = "127.0.0.1:50069"
    """TelemetryService (the read side of the event log)."""
    inspector: str = "127.0.0.1:50070"
    """The inspector's process (HTTP pages; its gRPC port serves health only)."""
    privacy: str = "127.0.0.1:50071"
    """PrivacyService (erasure, export, the erasure audit)."""


class ConfluenceConfig(_Section):
    """``knowledge.confluence``: the Confluence backend (REST v1, CQL search)."""

    base_url: str | None = None
    """The site's base URL, e.g. ``https://acme.atlassian.net/wiki`` (Cloud) or
    ``https://wiki.acme.com`` (Data Center); ``/rest/api/...`` is appended. Set: Confluence is the
    knowledge backend (unless ``knowledge.backend`` says otherwise)."""
    token: SecretStr | None = None
    """The org-level credential, used for a seat with no ``seat_credentials`` of its own and for
    the passes (promotion drafts, operators' reads). ``user:api-token`` is sent as Basic auth,
    anything else as a Bearer token."""
    timeout_seconds: float = 10.0
    """Deadline of one HTTP request."""
    page_size: int = Field(default=25, ge=1, le=200)
    """Results asked per request; a search follows ``_links.next`` for more."""
    max_pages: int = Field(default=4, ge=1)
    """Result pages one search follows at most (drafts filtered out can leave a page short)."""
    max_retries: int = Field(default=2, ge=0)
    """Retries of a request answered 429, each after its ``Retry-After``."""
    max_retry_after_seconds: float = 5.0
    """The longest ``Retry-After`` a request waits out; a longer one answers "rate limited" at once
    rather than holding the turn."""


class KnowledgeConfig(_Section):
    """``knowledge``: the knowledge backend of the deployment (spec: "one backend per org")."""

    backend: Literal["auto", "native", "confluence", "none"] = "auto"
    """``auto``: Confluence when ``knowledge.confluence.base_url`` is set (the spec's default),
    else the native pages in PostgreSQL (the embedded default); ``none``: no backend (every search
    answers "not configured"). On Confluence, ``workspace:<name>`` containers (session learning's
    project lessons) stay native pages and are searched beside it."""
    tool_skills_container: str | None = "tool-skills"
    """The Tool Skills registry: the container whose pages override or add to the bundled
    guidance blocks (a page titled like a block replaces it), read on every GetGuidance so an edit
    applies at once. Unset: the bundled blocks only."""
    search_timeout_seconds: float = 10.0
    """One search's deadline in the knowledge service; past it the search did not run."""
    confluence: ConfluenceConfig = ConfluenceConfig()
    """The Confluence backend."""


class TelemetryConfig(_Section):
    """OpenTelemetry. The standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``_PROTOCOL``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
    ``OTEL_SDK_DISABLED``) work as everywhere and win over these keys."""

    otlp_endpoint: str | None = None
    """OTLP collector for traces and metrics (e.g. http://otel-collector:4317); unset, and no
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, exports nothing (``/metrics`` still serves Prometheus)."""
    otlp_protocol: Literal["grpc", "http/protobuf"] = "grpc"
    """OTLP transport (``OTEL_EXPORTER_OTLP_PROTOCOL``)."""
    service_name: str = "agentlearn"
    """``service.name`` of this process (``OTEL_SERVICE_NAME``). ``./run serve <name>`` appends the
    service's name to the default (``agentlearn-diary``); a name set here is used as it is."""
    log_format: Literal["text", "json"] = "text"
    """Log lines: ``text`` for a terminal, ``json`` (one object per line, with trace and span ids)
    for a log pipeline (``--log-format``)."""
    sql_spans: Literal["off", "slow", "all"] = "slow"
    """Which SQL statements are spans of a recorded trace: ``slow`` (only those slower than
    ``sql_span_slow_ms``), ``all`` (every statement: the whole store path of a turn, at about a
    twentieth of a turn start's CPU), or ``off``. RPC spans are recorded whatever this says."""
    sql_span_slow_ms: float = Field(default=50.0, ge=0)
    """The threshold of ``sql_spans: slow``, in milliseconds."""


class LeaseConfig(_Section):
    backend: Literal["postgres", "kubernetes"] = "postgres"
    """Where passes claim their lease: a row in Postgres, or a ``coordination.k8s.io`` Lease."""
    ttl_seconds: int = 300
    """A claim expires this long after it was taken or renewed."""
    kubernetes_namespace: str = "agentlearn"
    """Namespace of the Lease objects."""
    kubernetes_api: str | None = None
    """API server URL; unset means in-cluster."""


class Settings(BaseModel):
    """The whole configuration. Construct with :func:`load_settings`.

    A plain model: :func:`load_settings` layers the YAML file, the environment and the overrides
    itself (so an explicit override beats the shell, and an explicit ``env`` replaces
    ``os.environ``) and the model only ever sees the merged result. Top-level keys match
    case-insensitively (``Data_Dir:`` is ``data_dir``), as they did when this was a
    pydantic-settings ``BaseSettings`` reading only its init arguments; sections below them are
    matched exactly.
    """

    # validate_default as BaseSettings had it: the defaults below go through the same checks as a
    # configured value.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True)

    database_url: SecretStr | None = None
    """PostgreSQL with pgvector; unset starts the embedded server under ``data_dir``."""
    database: DatabaseConfig = DatabaseConfig()
    """Pool, statement cache, migrations."""
    qdrant_url: str | None = None
    """A Qdrant server; unset uses Qdrant's embedded engine under ``data_dir``."""
    qdrant_api_key: SecretStr | None = None
    """Key of that server."""
    vector_index: Literal["auto", "qdrant", "edge", "local"] = "auto"
    """``auto``: ``qdrant`` when ``qdrant_url`` is set, else ``edge``; ``local`` is
    qdrant-client's local mode (tests)."""
    data_dir: Path = Path("data")
    """Embedded PostgreSQL and Qdrant data (``--data-dir``), kept across restarts."""
    providers: ProvidersConfig = ProvidersConfig()
    """Embeddings and auxiliary-model providers."""
    company_defaults: CompanyConfig = CompanyConfig(roles={"swe": RoleConfig()})
    """Applies to every company not listed under ``companies``. With no configuration at all it
    lists one role, ``swe`` (what ``./run demo``, the examples and the clients' quick starts use),
    so a fresh ``./run up`` learns from them; a config file that sets ``company_defaults`` lists its
    own roles (``config/agentlearn.example.yaml``)."""
    companies: dict[str, CompanyConfig] = Field(default_factory=dict)
    """Per-company overrides of ``company_defaults`` (roles, budgets), by company handle."""
    learning: LearningConfig = LearningConfig()
    """The spec's ``learning:`` block."""
    knowledge: KnowledgeConfig = KnowledgeConfig()
    """The knowledge backend (native pages or Confluence) and the Tool Skills registry."""
    sessions: SessionsConfig = SessionsConfig()
    """Session learning checks (spec/session-learning.txt)."""
    inspector: InspectorConfig = InspectorConfig()
    """The learning inspector's pages (docs/inspector.md)."""
    privacy: PrivacyConfig = PrivacyConfig()
    """Erasure, export and retention (docs/privacy.md)."""
    server: ServerConfig = ServerConfig()
    """The gRPC server."""
    services: ServiceAddresses = ServiceAddresses()
    """Addresses of the services in split mode and on Kubernetes."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """OpenTelemetry export."""
    auth: AuthConfig = AuthConfig()
    """Callers' credentials and the keys that sign what the services hand out."""
    leases: LeaseConfig = LeaseConfig()
    """Lease claims of the background passes."""
    run_passes_in_process: bool = True
    """The all-in-one and ``./run serve`` tick their services' passes on a clock; on Kubernetes the
    CronJobs run them, so the replicas set this false."""
    services_local_for_passes: bool = True
    """``./run pass`` serves the sibling services a pass calls from its own process; a CronJob in a
    cluster sets this false and reaches them at ``services.<name>``."""

    @model_validator(mode="before")
    @classmethod
    def _top_level_keys_ignore_case(cls, data: Any) -> Any:
        # What pydantic-settings' init source did with case_sensitive=False: a key naming a field in
        # another case is that field, the first such key given wins, anything else is left for
        # extra="forbid" to refuse.
        if not isinstance(data, dict) or all(key in cls.model_fields for key in data):
            return data
        out: dict[Any, Any] = {}
        taken: set[str] = set()
        for key, value in data.items():
            name = key.lower() if isinstance(key, str) else key
            if name in cls.model_fields:
                if name not in taken:
                    taken.add(name)
                    out[name] = value
            else:
                out[key] = value
        return out

    @model_validator(mode="after")
    def _chains_name_providers(self) -> Settings:
        names = set(self.providers.llm)
        chains = [("providers.auxiliary_chain", self.providers.auxiliary_chain)]
        for cname, company in [("company_defaults", self.company_defaults), *self.companies.items()]:
            for rname, role in company.roles.items():
                if role.llm_auxiliary is not None:
                    chains.append((f"{cname}.roles.{rname}.llm_auxiliary", role.llm_auxiliary))
        for where, chain in chains:
            unknown = [n for n in chain if n not in names]
            if unknown:
                raise ValueError(f"{where} names providers not under providers.llm: {unknown}")
        return self

    @model_validator(mode="after")
    def _confluence_has_a_site(self) -> Settings:
        if self.knowledge.backend == "confluence" and not self.knowledge.confluence.base_url:
            raise ValueError("knowledge.backend is confluence but knowledge.confluence.base_url is not set")
        return self

    def company(self, company: str) -> CompanyConfig:
        return self.companies.get(company, self.company_defaults)

    def company_key(self, company: str) -> str:
        """Where ``company``'s own settings live in the file (for a log naming the key to set)."""
        return f"companies.{company}" if company in self.companies else "company_defaults"

    def knowledge_backend(self) -> Literal["native", "confluence", "none"]:
        """The backend ``knowledge.backend`` resolves to (``auto``: Confluence when it has a site)."""
        chosen = self.knowledge.backend
        if chosen == "auto":
            return "confluence" if self.knowledge.confluence.base_url else "native"
        return chosen

    def tool_permission(self, company: str, role: str, tool: str) -> ToolPermission:
        """The role's own permission for ``tool``, else ``sessions.default_tool_permissions``, else
        ``allow``."""
        own = self.company(company).roles.get(role) if role else None
        if own is not None and tool in own.tool_permissions:
            value = own.tool_permissions[tool]
        else:
            value = self.sessions.default_tool_permissions.get(tool, "allow")
        # The models keep plain strings (see _permissions), whose validator admitted only these.
        return cast(ToolPermission, value)

    def default_workspace(self, company: str, user: str) -> str:
        """The workspace of the user's sessions that name none."""
        own = self.company(company).users.get(user)
        if own is not None and own.default_workspace:
            return own.default_workspace
        return self.sessions.default_workspace


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


_CONVENTIONAL_NAMES = ("DATABASE_URL", "QDRANT_URL", "QDRANT_API_KEY")


def _conventional_env(env: dict[str, str], configured_chain: Any = None) -> dict[str, Any]:
    """The environment names operators already use, mapped onto the config tree.

    ``configured_chain`` is the file's ``providers.auxiliary_chain`` (None when it names none):
    the OpenAI endpoint goes at its head rather than replacing it, since the merge that follows
    replaces lists whole and would otherwise drop the operator's providers silently."""
    # Each of these names its top-level knob in lower case.
    out: dict[str, Any] = {name.lower(): env[name] for name in _CONVENTIONAL_NAMES if env.get(name)}
    base, key = env.get("OPENAI_BASE_URL"), env.get("OPENAI_API_KEY")
    if base and key:
        # An OpenAI-compatible endpoint becomes the head of the auxiliary chain; the offline rules
        # stay behind it as the fallback, so a model outage degrades instead of stopping learning.
        out["providers"] = {
            "llm": {
                "openai": {
                    "kind": "openai",
                    "base_url": base,
                    "api_key": key,
                    "model": env.get("OPENAI_MODEL", "gpt-4o-mini"),
                },
                "offline": {"kind": "offline", "model": "offline-rules"},
            },
        }
        if configured_chain is None:
            out["providers"]["auxiliary_chain"] = ["openai", "offline"]
        elif isinstance(configured_chain, list):
            rest = [name for name in configured_chain if name != "openai"]
            out["providers"]["auxiliary_chain"] = ["openai", *dict.fromkeys(rest)]
        # Anything else is left as the file gave it, for validation to name.
        if env.get("OPENAI_EMBEDDINGS_MODEL"):
            out["providers"]["embeddings"] = {
                "kind": "openai",
                "base_url": base,
                "api_key": key,
                "model": env["OPENAI_EMBEDDINGS_MODEL"],
                "max_input_tokens": 8191,
            }
    return out


_ENV_PREFIX = "AGENTLEARN_"

_CLIENT_ENV = frozenset(
    {
        "AGENTLEARN_ADDRESS",
        "AGENTLEARN_REFLECTOR_ADDRESS",
        "AGENTLEARN_TOKEN",
        "AGENTLEARN_COMPANY",
        "AGENTLEARN_SEAT",
        "AGENTLEARN_ROLE",
        "AGENTLEARN_UNIT_CHAIN",
        "AGENTLEARN_TLS_CA",
        "AGENTLEARN_PROTOS",
    }
)
"""Variables agentlearn's own clients read (``./run mcp``, examples/, clients/python's build), not
configuration: a shell set up for the MCP server (docs/integrating.md) must still run ``./run``.
Only these are skipped; any other unknown ``AGENTLEARN_*`` name is still refused, so a typo of a
knob fails at start instead of being ignored."""


def _agentlearn_env(env: dict[str, str]) -> dict[str, Any]:
    """``AGENTLEARN_<SECTION>__<KNOB>`` variables as a nested mapping (keys case-insensitive; a
    value that reads as a JSON list or object is parsed, as pydantic-settings did for complex
    fields)."""
    out: dict[str, Any] = {}
    for key, value in env.items():
        upper = key.upper()
        if not upper.startswith(_ENV_PREFIX) or upper == "AGENTLEARN_CONFIG" or upper in _CLIENT_ENV:
            continue
        path = [part.lower() for part in key[len(_ENV_PREFIX) :].split("__") if part]
        if not path:
            continue
        parsed: Any = value
        if value[:1] in "[{":
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = value
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = parsed
    return out


class ConfigError(ValueError):
    """A configuration that cannot be used, said in one line naming the file and the key."""


def load_settings(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> Settings:
    """Read the YAML file (``path`` or ``$AGENTLEARN_CONFIG``), apply the environment, then overrides.

    Precedence, highest first: ``overrides`` (flags, tests), the environment (``env``, default
    ``os.environ``), the YAML file, the defaults. Anything wrong is a :class:`ConfigError` whose
    message is one line naming the file (or the environment) and the key.
    """
    env = dict(os.environ if env is None else env)
    path = path or env.get("AGENTLEARN_CONFIG")
    data: dict[str, Any] = {}
    source = "the configuration"
    if path:
        import yaml  # only a process given a config file parses YAML (a pass pod reads its environment)

        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ConfigError(f"{path}: cannot read the config file: {err.strerror}") from None
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{path}{at}: not valid YAML: {problem}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data = loaded
        source = f"{path} (or the environment)"
    providers = data.get("providers")
    configured_chain = providers.get("auxiliary_chain") if isinstance(providers, dict) else None
    data = _deep_merge(data, _conventional_env(env, configured_chain))
    data = _deep_merge(data, _agentlearn_env(env))
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return Settings(**data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first.get("loc", ())) or "(top level)"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise ConfigError(f"{source}: {key}: {first.get('msg', 'invalid')}{more}") from None
