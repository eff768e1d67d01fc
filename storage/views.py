"""Predefined analytics views in the SQL catalog: the questions users ask of every RL run.

Each view names the tables it needs; the catalog creates it when they all exist, so
`rlvr sql "select * from learning_zone_share"` works on any lake that has groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.schemas import VERIFICATION_ROUND


@dataclass(frozen=True)
class View:
    name: str
    needs: tuple[str, ...]
    sql: str
    description: str


VIEWS = [
    View(
        "solve_rate_by_level",
        ("groups", "problems"),
        f"""
        select g.model_version, p.level, count(*) as groups, avg(g.solve_rate) as solve_rate
        from groups g join (select distinct problem_id, level from problems) p using (problem_id)
        where coalesce(g.round, 0) <> {VERIFICATION_ROUND}
        group by all order by 1, 2""",
        "training groups' mean solve rate per model version and level",
    ),
    View(
        "eval_solve_rate_by_level",
        ("evaluations",),
        """
        select model_version, level, sum(problems) as problems, sum(solved) / sum(samples) as solve_rate
        from evaluations group by all order by 1, 2""",
        "held-out sampled solve rate per model version and level",
    ),
    View(
        "eval_pass_at_k",
        ("evaluations",),
        """
        select model_version, max(k) as k, sum(problems) as problems, sum(solved) / sum(samples) as pass_at_1,
               sum(pass_at_k * problems) / sum(problems) as pass_at_k
        from evaluations where k is not null group by 1 order by 1""",
        "held-out pass@1 and pass@k per model version (evaluations with `evaluation.k`)",
    ),
    View(
        "learning_zone_share",
        ("groups",),
        f"""
        select iteration, count(*) as groups,
               avg(case when solve_rate between 0.2 and 0.5 then 1.0 else 0.0 end) as zone_share
        from groups where coalesce(filter_reason, '') <> 'surplus' and coalesce(round, 0) <> {VERIFICATION_ROUND}
        group by 1 order by 1""",
        "share of drawn groups in the 20-50 % learning zone, per iteration",
    ),
    View(
        "filter_stats",
        ("groups",),
        """
        select iteration, outcome, groups, groups / sum(groups) over (partition by iteration) as share
        from (select iteration, coalesce(filter_reason, 'kept') as outcome, count(*) as groups
              from groups group by 1, 2)
        order by 1, 2""",
        "what dynamic sampling did with the groups of each iteration",
    ),
    View(
        "problem_history",
        ("groups", "dbb_state"),
        f"""
        select g.problem_id, g.iteration, g.run_id, g.model_version, g.group_id, g.round, g.n_samples as trials,
               round(g.solve_rate * g.n_samples)::bigint as successes, g.solve_rate, g.kept, g.filter_reason,
               d.dbb_alpha, d.dbb_beta, d.dbb_alpha / (d.dbb_alpha + d.dbb_beta) as predicted_solve_rate
        from groups g left join dbb_state d using (problem_id, iteration)
        where coalesce(g.round, 0) <> {VERIFICATION_ROUND}""",
        "the difficulty ledger: every group drawn of every problem (by its content hash, so across runs and bank "
        "versions), with the discounted Beta-Bernoulli state after its iteration and the solve rate it predicts",
    ),
    View(
        "problem_estimates",
        ("groups", "dbb_state"),
        """
        select problem_id, model_version, count(*) as groups, sum(trials) as trials, sum(successes) as successes,
               max(iteration) as last_iteration, arg_max(predicted_solve_rate, iteration) as predicted_solve_rate
        from problem_history group by all""",
        "per problem and model version that sampled it: its groups and trials, and the predicted solve rate of "
        "the DBB state after the last of them",
    ),
    View(
        "staleness_stats",
        ("advantages",),
        """
        select iteration, freshness, count(*) as rollouts, avg(staleness) as mean_staleness,
               avg(importance_weight) as mean_importance_weight
        from advantages group by all order by 1, 2""",
        "fresh, acceptable and stale rollouts per iteration",
    ),
    View(
        "response_lengths",
        ("rollouts", "rewards"),
        """
        select r.iteration, r.model_version, w.verifier, coalesce(w.correct, w.reward >= 0.5) as solved,
               count(*) as responses, avg(r.n_tokens) as mean_tokens, median(r.n_tokens) as median_tokens,
               quantile_cont(r.n_tokens, 0.9) as p90_tokens, avg((r.finish_reason = 'length')::int) as truncated_share
        from rollouts r join rewards w using (rollout_id) group by all order by 1, 3, 4""",
        "response length and truncation of solved and unsolved responses",
    ),
    View(
        "verifier_disagreements",
        ("rewards",),
        """
        select a.iteration, a.verifier as verifier_a, a.verifier_version as version_a, b.verifier as verifier_b,
               b.verifier_version as version_b, count(*) as rollouts,
               sum((a.correct is distinct from b.correct)::int) as disagreements,
               avg((a.correct is distinct from b.correct)::int) as disagreement_rate
        from rewards a join rewards b on a.rollout_id = b.rollout_id
             and (a.verifier, a.verifier_version) < (b.verifier, b.verifier_version)
        group by all order by 1, 2, 4""",
        "how often two verifiers (or versions) judge the same rollouts differently",
    ),
    View(
        "proposal_health",
        ("proposals",),
        """
        with ordered as (
            select *, task_key is not null and row_number() over (partition by task_key order by iteration,
                       proposal_id) = 1 as new_task,
                   verdict = 'valid' and shape_key is not null and row_number() over (partition by shape_key
                       order by iteration, proposal_id) > 1 as repeated_shape
            from proposals)
        select iteration, count(*) as proposals, sum((verdict = 'valid')::int) as valid,
               avg((verdict = 'valid')::double) as valid_rate,
               sum(new_task::int) / nullif(sum((task_key is not null)::int), 0) as distinct_rate,
               sum(repeated_shape::int) / nullif(sum((verdict = 'valid' and shape_key is not null)::int), 0)
                   as near_duplicate_rate,
               avg(solve_rate) filter (where verdict = 'valid') as mean_solve_rate,
               stddev_samp(solve_rate) filter (where verdict = 'valid') as solve_rate_std
        from ordered group by 1 order by 1""",
        "self-play collapse monitoring per iteration: valid-proposal, distinct-task and near-duplicate rates, "
        "the solver's solve rate on the proposals and its spread (tasks/selfplay/health.py)",
    ),
    View(
        "proposal_rejections",
        ("proposals",),
        """
        select iteration, task_type, coalesce(reason, 'valid') as outcome, count(*) as proposals
        from proposals group by all order by 1, 2, 4 desc""",
        "self-play proposals per iteration, task type and validity rule broken",
    ),
    View(
        "self_verification",
        ("rewards", "problems"),
        """
        select r.iteration,
               count(*) filter (where p.source = 'self-verify') as verification_rollouts,
               avg(r.correct::int) filter (where p.source = 'self-verify') as verification_accuracy,
               avg((r.reward = 1)::int) filter (where p.source = 'self-verify') as full_credit_share,
               avg(r.correct::int) filter (where p.source <> 'self-verify') as solve_rate
        from rewards r join (select distinct problem_id, source, verifier from problems) p
             on r.problem_id = p.problem_id and r.verifier = p.verifier
        group by 1 order by 1""",
        "RISE: per iteration, the accuracy of the policy's verdicts on verification tasks (full credit: the "
        "first wrong step too) beside its solve rate on the other problems",
    ),
    View(
        "code_solve_rate_by_code_level",
        ("rewards", "problems"),
        """
        select r.iteration, p.code_level, count(*) as rollouts, avg(r.correct::int) as solve_rate,
               avg(r.reward) as mean_reward
        from rewards r join (select distinct problem_id, verifier,
                                    coalesce(json_extract_string(metadata, '$.code_level'), 'function') as code_level
                             from problems where domain = 'code') p
             on r.problem_id = p.problem_id and r.verifier = p.verifier
        group by all order by 1, 2""",
        "code rollouts' solve rate and mean reward per iteration and granularity (function, file, project)",
    ),
    View(
        "failing_tests",
        ("rewards",),
        """
        select problem_id, test.name as test, count(*) as runs, sum((not test.passed)::int) as failures,
               avg((not test.passed)::int) as failure_rate, any_value(test.message) filter (where not test.passed)
               as example_message
        from (select problem_id, unnest(from_json(json_extract(details, '$.tests'),
                                                  '[{"name": "VARCHAR", "passed": "BOOLEAN", "message": "VARCHAR"}]'))
                     as test
              from rewards where verifier = 'workspace')
        group by all order by failures desc, 1, 2""",
        "file- and project-level code: each test's failure count and rate over the scored rollouts",
    ),
    View(
        "tool_use",
        ("rollouts", "rewards", "problems"),
        """
        select r.iteration, count(*) as episodes, avg((r.tool_calls > 0)::int) as calling_share,
               avg(r.tool_calls) as mean_tool_calls, sum(r.tool_errors) / nullif(sum(r.tool_calls), 0) as tool_error_rate,
               avg(w.correct::int) filter (where r.tool_calls > 0) as solve_rate_with_calls,
               avg(w.correct::int) filter (where r.tool_calls = 0) as solve_rate_without_calls
        from rollouts r join rewards w on r.rollout_id = w.rollout_id and r.iteration = w.iteration
             join (select distinct problem_id, verifier from problems) p
             on w.problem_id = p.problem_id and w.verifier = p.verifier
        where r.tool_calls is not null group by 1 order by 1""",
        "multi-turn episodes per iteration: share with a tool call, calls, tool error rate, and solve rate with "
        "and without a call",
    ),
    View(
        "reward_hacking_signals",
        ("rollouts", "rewards", "iteration_metrics"),
        """
        with per_iteration as (
            select r.iteration, avg(w.reward) as train_reward, avg(r.n_tokens) as mean_tokens,
                   avg((regexp_matches(r.response, '\\\\boxed\\{[^}]*\\}.*\\\\boxed\\{')
                        or regexp_matches(lower(r.response), 'answer is [^.]* or '))::int) as hedged_share
            from rollouts r join rewards w using (rollout_id) group by 1),
        joined as (
            select p.*, m.eval_solve_rate from per_iteration p left join iteration_metrics m using (iteration)),
        evaluated as (
            select *, train_reward - lag(train_reward) over (order by iteration) as reward_change,
                   mean_tokens - lag(mean_tokens) over (order by iteration) as length_change,
                   eval_solve_rate - lag(eval_solve_rate) over (order by iteration) as eval_change
            from joined where eval_solve_rate is not null)
        select *, reward_change > 0 and eval_change < 0 as reward_up_eval_down,
               length_change > 0 and eval_change <= 0 as longer_without_gain, hedged_share > 0.05 as hedging
        from evaluated order by iteration""",
        "between evaluated iterations: training reward up while held-out accuracy falls, longer responses "
        "without accuracy, hedged answers",
    ),
]
