#pragma once
// Step planners: how a global batch's sequences become a StepPlan (planning/plan.h).
//
// plan_naive is ByteScale's Algorithm 1 (Ge et al., 2025, the communication
// optimizer's data-aware sharding with selective offloading): sequences
// that fit one rank are packed whole into micro-batches (no communication); a
// longer one gets the fewest ranks the cost model allows, with a selective
// activation-offload ratio, and runs as a zig-zag ring over exactly those ranks.
// plan_balance is Algorithm 2 on top: the same work spread so that every rank's
// predicted time (predicted_rank_seconds) is about equal.
// plan_static is the baseline of static systems: a fixed dp x cp grid, every
// packed row split over the cp ranks of its group whatever its sequences' lengths.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "planning/activation_mix.h"
#include "planning/cost_model.h"
#include "planning/plan.h"

namespace hdp {

struct OffloadSettings {
  bool enabled = true;
  double forced_ratio = -1;  // < 0: chosen by the cost model; else used for every long sequence
  // Host memory one rank may fill with offloaded activations (all micro-batches a
  // pipeline stage keeps in flight); 0 = unlimited. A sequence whose offload would
  // exceed it gets more ranks and a lower ratio.
  double host_bytes_per_rank = 0;
};

struct PlannerSettings {
  int hdp = 1;
  int64_t capacity = 0;          // C: tokens per rank and micro-batch without offload
  int64_t layers_per_stage = 1;  // l
  int pipeline_stages = 1;
  CostModel cost;
  OffloadSettings offload;
  // Recomputation as offload's alternative (planning/activation_mix.h): with
  // recompute.max_layers > 0 a long sequence's micro-batches may recompute their
  // stage's first layers (choose_ranks). 0: offload alone, as ByteScale plans.
  RecomputeOption recompute;
  // Expert parallelism (model/moe.h): hdp ranks [g ep, (g + 1) ep) form group g, whose
  // MoE layers exchange tokens by all-to-all in every micro-batch, so its members run
  // their i-th micro-batches in lock step (lock_step_seconds). 1: no coupling. Must
  // divide hdp.
  int ep = 1;
};

struct LongSequenceChoice {
  double ratio = 0;  // offload ratio of the sequence's micro-batches
  int ranks = 1;     // ring size D
  int64_t recompute_layers = 0;  // of the stage's layers, in its micro-batches
};

// The activation-mix settings (planning/activation_mix.h) of a micro-batch under
// these settings: capacity, layers per stage, cost, recompute option, offload on
// unless disabled or forced, host memory per micro-batch the rank's budget over the
// pipeline stages in flight.
ActivationMixSettings activation_mix_settings(const PlannerSettings& settings);

// The most tokens any member of a ring of `ring_size` ranks holds of a sequence of
// `length` tokens (its two zig-zag chunks).
int64_t zigzag_max_member_tokens(int64_t length, int ring_size);

// Offload ratio r and ranks D for a sequence of `length` tokens. With
// l = layers_per_stage and C = capacity, D is the smallest count that satisfies
// both the memory model, D >= (2 + (1 - r)(l - 2)) Act(s) / (l Act(C)) (for l <= 2:
// Act(s) / Act(C), and r = 0 since offload frees nothing; skipped if Act(C) <= 0),
// and the token limit: every member's two zig-zag chunks together hold at most
// max_micro_batch_tokens(C, l, r) tokens. r is 0 if offload is disabled or l <= 2;
// else forced_ratio if that is >= 0; else the largest r whose copies hide under
// compute, T(s) >= Act(s) r / min(B_d2h, B_h2d), lowered to the smallest r that
// needs no more ranks. Throws std::invalid_argument if D > hdp.
// With recompute.max_layers > 0 (and no forced ratio) instead: D is the fewest ranks
// whose members' micro-batches (zigzag_max_member_tokens) have an activation mix
// that adds no time (choose_activation_mix: hidden copies, free reruns), or else hdp
// when a costly one fits there, and the ratio and recomputed layers are that mix's
// (each member's layer compute T(s) / D hides its copies). Throws when none fits on
// hdp ranks.
LongSequenceChoice choose_ranks(int64_t length, const PlannerSettings& settings);

// Algorithm 1. Sequences of at most C tokens are packed best-fit decreasing into
// micro-batches of C tokens (r = 0). Longer ones take choose_ranks; one that still
// needs one rank (thanks to offload) is a micro-batch of its own. The others, in
// descending length, each take the first slot with D free ranks (the D lowest free
// ones, in increasing order, form its ring) and occupy that slot on all of them.
// Then packed micro-batches, largest first, fill free cells: each into the earliest
// free cell of the rank with the fewest tokens so far that has one; the rest go
// after the slots, each to the rank with the fewest tokens.
// With one pipeline stage, free cells left over are dropped (ring order follows the
// slot order on every rank, which is all the plan needs). With several stages they
// stay as empty micro-batches on ranks in rings, and all ranks of a connected group
// of rings are padded with empty micro-batches to one count, so their 1F1B
// schedules are identical.
StepPlan plan_naive(std::span<const int64_t> lengths, const PlannerSettings& settings);

// Static dp x cp baseline (r = 0). cp must divide hdp; cp = 0 picks the smallest
// divisor of hdp whose zig-zag split fits the longest sequence into C tokens per
// rank. Group g is hdp ranks [g cp, (g + 1) cp). Sequences are packed best-fit
// decreasing into rows of cp C tokens, where a sequence fits a row only if every
// member's tokens (counted exactly, chunk by chunk) stay within C. With cp > 1 a
// row is one ring of its group's ranks holding all the row's sequences; with
// cp = 1 its sequences are local. Rows go largest first to the group with the
// fewest tokens; a group's members run identical lists.
StepPlan plan_static(std::span<const int64_t> lengths, const PlannerSettings& settings, int cp);

// The balance scheduler (ByteScale's Algorithm 2).
enum class BalanceMode { DataParallel, Pipeline };
struct BalanceSettings {
  BalanceMode mode = BalanceMode::DataParallel;
  double threshold = 0.05;  // ranks whose accumulated time is more than this fraction below the maximum get work
  // Also try spreading a long sequence whose share per choose_ranks rank would cost
  // more than the mean rank's load over more ranks: ceil(its seconds / mean load),
  // at most hdp, and at most as many as leave each member widen_min_fill x capacity
  // tokens (so that ring steps keep attention work to hide their transfers under).
  // PP-Balance's waves (plan_balance, with pipelines and step_seconds) widen their
  // rings within the same limits (hdp, widen_min_fill) whether or not this is set.
  bool widen = true;
  double widen_min_fill = 0.25;
  // When set, the candidates are compared by this instead: a plan's step seconds.
  // `trainer plan` passes the step simulator's (whatif/step_simulation.h), which
  // sees pipeline bubbles and ring waits that the predicted busiest rank does not;
  // so does the trainer under pipelines, with its own costs (run/step_planner.h).
  std::function<double(const StepPlan&)> step_seconds;
  // With step_seconds and several pipeline stages: also try every candidate with the
  // deepest forward limits its micro-batches' memory allows (StepPlan::forward_limits,
  // plan_deepest_forward_limits). The trainer's executor runs 1F1B only, so only `trainer
  // plan`'s balance-deep policy sets it.
  bool deeper_warmup = false;
  // With step_seconds, one pipeline stage and ep 1: what each rank's micro-batches
  // take, per rank and list index, as the step simulator sees them
  // (StepSimulation::micro_batch_seconds: its small-kernel rates and exposed ring
  // transfers, which the cost model leaves out). The chosen plan is then re-timed by
  // them (plan_balance), since a timed layout aligns a ring's members only as well as
  // its costs predict their clocks.
  std::function<std::vector<std::vector<double>>(const StepPlan&)> micro_batch_seconds;
};
// Work items: short sequences packed best-fit decreasing into C tokens and long
// ones with choose_ranks's ranks and offload ratio, exactly as plan_naive; an item
// costs what predicted_rank_seconds charges each rank it occupies. Items are
// sorted by cost, most expensive first, and cut into ceil(items / hdp) buckets of
// about equal total cost. Rounds: the ranks more than `threshold` x max below the
// busiest rank (all ranks when none is) are served once each, least loaded first,
// with the round's items most expensive first; a ring item takes as many
// consecutive served ranks as it needs (a ring wider than the eligible ranks,
// drawn first in its round, takes the least loaded ranks). Items come from the
// first non-empty bucket (DataParallel) or from the buckets in turn (Pipeline).
// Then moves and swaps of the busiest rank's micro-batches, and moves of its rings
// to the least loaded ranks, while they lower it. The same is done with widened
// rings (BalanceSettings::widen) and, as a third candidate, starting from
// plan_naive's assignment; the candidate with the smallest predicted maximum wins
// (ties: the first), so the result never predicts a slower step than plan_naive
// (with ep > 1: than plan_naive's assignment listed as this scheduler lists it).
// With settings.ep > 1 the candidates are compared by their laid-out plans'
// predicted_rank_seconds, that is coupled by lock_step_seconds (each rank's own
// micro-batches are listed most expensive first, so the i-th micro-batches of a
// group's members tend to be of similar cost), and when no sequence needs a ring a
// fourth candidate aligns them on purpose: the items, most expensive first, cut into
// rows of ep, each row costing its first item, the rows going to the ep group with
// the least summed row cost, member m taking the row's m-th item. The rounds and the
// refinement still balance the ranks' own sums.
// Bound (without the candidates' help): every round gives items in decreasing cost
// to ranks in increasing load, which keeps max - min load <= the costliest item c,
// so max <= total / hdp + c (hdp - 1) / hdp. Ranks with cheaper micro-batches
// receive more of them.
// Lists: rings in one global order, each at the first slot after all its members'
// earlier rings; a rank's own micro-batches, most expensive first, fill the holes
// before its rings and then follow them. With several pipeline stages left-over
// holes stay as empty micro-batches, so a ring sits at one index on all its members
// (their 1F1B schedules then meet it together; micro-batch counts may differ);
// with one stage they are dropped. With one stage (and ep = 1) the result is laid
// out by predicted time instead ("timed"): each rank keeps a clock of its list's
// predicted seconds, a ring starts at the latest of its members' clocks, and a
// member first runs those of its own micro-batches (most expensive first) that fit
// in its wait, so members reach a ring together and own work never delays one; the
// rest follow its last ring. Passes check_plan.
// With BalanceSettings::step_seconds every candidate is laid out and that decides
// (ties: the first), each both with the holes filled and, with several pipeline
// stages, with its rings first (a rank's own micro-batches after its last ring,
// holes left empty: long sequences first, as ByteScale's PP-Balance orders them), or
// with one stage timed; plan_naive's
// plan itself is a candidate, so the result's step is never longer than
// plan_naive's by that measure, and so is plan_naive's without offload (rings sized
// by device memory alone) when offload is on, not forced, and it fits.
// The measure also sees ByteScale's PP-Balance (Ge et al., 2025) as waves (with
// one stage too), laid out both ways, from these settings and from those
// without offload where they fit: the sequences that need rings, longest first,
// packed first-fit by their choose_ranks counts into waves of at most hdp ranks; in
// a wave the ring whose members cost most (seconds / ranks) takes one more rank at a
// time (up to widen's limits, hdp and length / (widen_min_fill C) ranks, whether or
// not widen is set; at the offload ratio or recomputation those ranks need) until
// the wave holds every rank or each of its rings has its most ranks, so its rings
// cost their members about one amount. Wave by wave the rings take consecutive
// ranks from rank 0 and each ring sits at one index on all its members, so they
// reach it together, in 1F1B and in the interleaved order alike. Where every wave
// holds every rank, every rank runs one ring micro-batch per wave at the wave's index
// and all pipelines run the same costs until their last ring; a partial wave leaves
// its last ranks a hole (an empty micro-batch, or one of their own), and a later ring
// sits at the highest of its members' next slots. Waves go costliest first, except
// that the first pp of them are reversed: while the costliest wave's micro-batch
// passes the later stages and comes back, 1F1B runs pp - 1 other forwards and
// backwards on stage 0, and these are then the next costliest. The one-rank
// micro-batches follow, each (most expensive first) to the least loaded rank, so
// pipelines take different numbers. With BalanceSettings::deeper_warmup each
// candidate competes also with the deepest forward limits its memory allows.
// With several pipeline stages the measure also sees, after all these (ties keep
// them): the widen candidate once more against the mean load over pp (a ring's
// micro-batch passes every stage's forward and backward in turn under 1F1B, so it
// spans pp times its members' seconds per stage), laid out both ways; and, where the
// ranks average fewer than pp micro-batches at C and at least half are packed (ring
// cells the rest), the short sequences packed best-fit decreasing into C/2, C/4 and
// C/8 tokens (one above the target alone; memory and rings keep C), each target that
// adds micro-batches scheduled as candidate 1 (holes filled) and as waves: more,
// smaller micro-batches shrink 1F1B's bubble.
StepPlan plan_balance(std::span<const int64_t> lengths, const PlannerSettings& settings, const BalanceSettings& balance);

// The busy seconds of ranks coupled by expert parallelism. seconds[r][i] is rank r's
// i-th micro-batch's time alone; ranks [g ep, (g + 1) ep) run their i-th micro-batches
// together (every MoE layer's all-to-all waits for the group's slowest member, and a
// member with fewer micro-batches runs empty ones that only join the exchanges,
// TrainingEngine::forward_backward), so each member of group g is busy for
//   sum over i of max over members m of seconds[m][i]   (a missing one counts 0).
// With ep = 1 this is each rank's own sum. Throws std::invalid_argument unless ep >= 1
// divides the ranks.
std::vector<double> lock_step_seconds(const std::vector<std::vector<double>>& seconds, int ep);

// Predicted seconds of forward and backward each hdp rank spends on its
// micro-batches, under the cost model, for one pipeline stage of layers_per_stage
// layers (l): a local piece of t tokens costs l (T(t) + R(t)); a ring of k ranks costs
// each member l (T(s) + R_ring(s)) / k per sequence of s tokens it carries (the
// zig-zag split gives every member equal attention work and, up to rounding, equal
// tokens; R: CostModel::recompute_seconds, 0 without recomputation). With one
// pipeline stage the rank holds the whole model and every token also costs
// embedding_seconds_per_token + head_seconds_per_token (a ring member: s / k tokens
// of each sequence); with several stages this is one stage's layer time only (the
// embedding and head add to the first and last stage). Empty micro-batches cost
// nothing, and offload adds nothing (its copies must hide under compute); a
// micro-batch's recomputed layers (PlannedMicroBatch::recompute_layers) add their
// rerun, settings.recompute.recomputed's recompute_seconds of each piece. With
// settings.ep > 1 the micro-batches' times are coupled by lock_step_seconds, in
// the order the plan lists them.
std::vector<double> predicted_rank_seconds(const StepPlan& plan, std::span<const int64_t> lengths,
                                           const PlannerSettings& settings);

}  // namespace hdp
