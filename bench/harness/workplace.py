"""The made-up workplace several benchmarks fill their seats from: people, the tasks a seat is
asked to do, and the tool sets a turn calls. One list each, so the benchmarks' texts stay the same
phrases; a benchmark that uses fewer picks them by index (its rows, and so its figures, stay what
earlier runs measured)."""

from __future__ import annotations

__all__ = ["PEOPLE", "TOOLSETS", "TOPICS"]

PEOPLE = ["Ana", "Bob", "Carla", "Dan", "Eve", "Farid", "Gus", "Hana"]
TOPICS = [
    "rotate the staging database credentials",
    "fix the flaky kafka consumer test",
    "send the weekly status report",
    "triage the billing export timeout",
    "review the pull request for the auth service",
    "plan the offsite dinner for the platform team",
    "renew the TLS certificate for the public API",
    "investigate the memory leak in the ingest worker",
    "update the onboarding page for new hires",
    "draft the incident postmortem for last night's outage",
    "migrate the cron jobs to the new scheduler",
    "answer a question about the holiday calendar",
    "bump the python dependencies and rerun CI",
    "clean up stale feature flags",
    "reconcile the invoices that failed to sync",
    "summarise the customer feedback from the survey",
]
TOOLSETS = [
    ["jira.search", "jira.update"],
    ["github.read", "github.pr", "slack.post"],
    ["vault.read", "vault.write", "slack.post"],
    ["pagerduty.ack", "grafana.query", "slack.post"],
    ["gmail.read", "gmail.send"],
    ["confluence.search", "confluence.edit"],
    ["ci.rerun", "github.read"],
    ["sql.query", "sheets.write"],
    ["calendar.read", "calendar.create", "slack.post"],
    ["k8s.get", "k8s.logs", "grafana.query"],
    ["jira.search", "confluence.search", "slack.post"],
    ["stripe.search", "sheets.write", "gmail.send"],
]
