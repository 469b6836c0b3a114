// The BullMQ side of bench/bullmq.py and bench/life.py: one Node process, driven by JSON lines on stdin.
//   {"op": door, "n": calls, "round": r}  -> sets the door up, answers {"ready": true}
//   {"go": true}                           -> runs n timed calls, answers {"walls_us": [...]}
//   {"op": "life", "n": jobs, "round": r, "concurrency": c, "timeout_s": t}
//                                          -> a fresh queue and a Worker (no-op processor, concurrency c, not
//                                             running yet), answers {"ready": true}
//   {"go": true} after "life"              -> queue.add of the n jobs one by one, then the Worker runs until n
//                                             jobs completed or failed, then closes; answers {"completed": events,
//                                             "failed": events, "wall_s": seconds}
//   {"counts": true}                       -> the life's queue's job counts by state (completed, failed, ...),
//                                             read after the Python side's measurement; closes the queue
//   {"quit": true}                         -> closes everything and exits
// Between "ready" and "go" the Python side resets the server's statistics (or reads its CPU), so they count the
// timed part only.
'use strict';
const readline = require('readline');
const { Queue, Worker } = require('bullmq');

const [host, port] = [process.env.BENCH_REDIS_HOST || '127.0.0.1', Number(process.env.BENCH_REDIS_PORT)];
const connection = { host, port, maxRetriesPerRequest: null };
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
let pending = null;  // {run: async (i) => ..., n, close: async () => ...}, or {life: async () => ...} for "life"
let counted = null;  // the queue of the last life, kept open for its "counts"

// A job's whole life, BullMQ's way: n adds one by one (as rq enqueues one by one), then a Worker with a no-op
// processor runs until all n are completed. Job and worker options are BullMQ's defaults (removeOnComplete and
// removeOnFail unset: completed jobs and their return values are kept, as rq keeps results) but concurrency and
// autorun: false (the worker starts after the adds, as rq's burst worker does).
async function setupLife(n, round, concurrency, timeoutS) {
  const name = `life-${round}-c${concurrency}`;
  const queue = new Queue(name, { connection });
  await queue.waitUntilReady();
  const seen = { completed: 0, failed: 0 };
  let finish = null;
  const done = new Promise((resolve) => { finish = resolve; });
  const count = (what) => () => { seen[what] += 1; if (seen.completed + seen.failed >= n) finish(); };
  const worker = new Worker(name, async () => {}, { connection, concurrency, autorun: false });
  worker.on('completed', count('completed'));
  worker.on('failed', count('failed'));
  await worker.waitUntilReady();
  pending = {
    life: async () => {
      const start = process.hrtime.bigint();
      for (let i = 0; i < n; i++) await queue.add('work', { i });
      const running = worker.run();
      let timer = null;
      const late = new Promise((resolve) => { timer = setTimeout(resolve, timeoutS * 1000); });
      await Promise.race([done, late]);
      clearTimeout(timer);
      await worker.close();
      await running;
      counted = queue;
      return { completed: seen.completed, failed: seen.failed, wall_s: Number(process.hrtime.bigint() - start) / 1e9 };
    },
  };
}

async function counts() {
  const found = await counted.getJobCounts('completed', 'failed', 'waiting', 'active', 'delayed', 'prioritized');
  await counted.close();
  counted = null;
  return found;
}

async function setup(op, n, round) {
  const name = `bq-${op}-${round}`;
  const queue = new Queue(name, { connection });
  await queue.waitUntilReady();
  const closers = [() => queue.close()];
  let run;
  if (op === 'dedup_admit') {
    run = (i) => queue.add('work', { i }, { deduplication: { id: `a-${round}-${i}` } });
  } else if (op === 'dedup_drop') {
    await queue.add('work', { i: 'held' }, { deduplication: { id: 'held' } });
    run = () => queue.add('work', { i: 'held' }, { deduplication: { id: 'held' } });
  } else if (op === 'plain_add') {
    run = (i) => queue.add('work', { i });
  } else if (op === 'fetch') {
    await queue.addBulk(Array.from({ length: n + 1 }, (_, i) => ({ name: 'work', data: { i } })));
    const worker = new Worker(name, null, { connection, autorun: false });
    await worker.waitUntilReady();
    closers.unshift(() => worker.close(true));
    await worker.getNextJob('warm', { block: false });  // the script is loaded before the timed calls
    run = async (i) => {
      const job = await worker.getNextJob(`t-${round}-${i}`, { block: false });
      if (!job) throw new Error('moveToActive found no job');
    };
  } else {
    throw new Error(`unknown op ${op}`);
  }
  if (op !== 'fetch') await run(-1);  // the script is loaded (and, for a drop, the first add holds the id)
  pending = { run, n, close: async () => { for (const close of closers) await close(); } };
}

async function go() {
  const walls = [];
  for (let i = 0; i < pending.n; i++) {
    const start = process.hrtime.bigint();
    await pending.run(i);
    walls.push(Number(process.hrtime.bigint() - start) / 1000);
  }
  await pending.close();
  pending = null;
  return walls;
}

const lines = readline.createInterface({ input: process.stdin });
let chain = Promise.resolve();
lines.on('line', (line) => {
  chain = chain.then(async () => {
    const msg = JSON.parse(line);
    try {
      if (msg.quit) { lines.close(); process.exit(0); }
      if (msg.go && pending && pending.life) { const life = pending.life; pending = null; out(await life()); return; }
      if (msg.go) { out({ walls_us: await go() }); return; }
      if (msg.counts) { out(await counts()); return; }
      if (msg.op === 'life') await setupLife(msg.n, msg.round, msg.concurrency || 1, msg.timeout_s || 300);
      else await setup(msg.op, msg.n, msg.round);
      out({ ready: true });
    } catch (err) {
      out({ error: String(err && err.stack || err) });
    }
  });
});
