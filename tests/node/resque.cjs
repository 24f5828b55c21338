// Drives a real node-resque for the tests: `node resque.cjs <install dir> <command> <JSON spec>`.
//
// Commands:
//   steps  run spec.steps (enqueue jobs now or later, workers that finish a known number of
//          jobs, workers kept busy or idle), print "ready", then keep held workers until SIGTERM
//   truth  print what the library itself says (its Queue API), as JSON
// Jobs: "ok" completes, "fail" throws, "slow" sleeps its first argument (ms), then completes.
'use strict';
const path = require('path');

const [installDir, command, specText] = process.argv.slice(2);
const NR = require(path.resolve(installDir, 'node_modules', 'node-resque'));
const spec = JSON.parse(specText);
const connection = () => ({
  host: spec.host, port: spec.port, database: spec.db, namespace: spec.namespace || 'resque',
});

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
const jobs = {
  ok: { perform: async () => 'done' },
  fail: { perform: async () => { throw new Error('planned failure'); } },
  slow: { perform: async ms => { await sleep(ms); return 'done'; } },
};

async function queueObject() {
  const queue = new NR.Queue({ connection: connection() }, jobs);
  queue.on('error', error => console.error(error));
  await queue.connect();
  return queue;
}

// A worker of `queues` named `name` (node-resque names it <host>:<pid> by default, one a
// process); it polls every 200 ms (5 s by default), so a test's workers finish soon.
async function worker(step) {
  const w = new NR.Worker({ connection: connection(), queues: step.queues, name: step.name, timeout: 200 }, jobs);
  w.on('error', error => console.error(error));
  await w.connect();
  return w;
}

// A worker that stops once it completed and failed the given numbers of jobs.
async function workUntil(step) {
  const w = await worker(step);
  const done = { completed: 0, failed: 0 };
  await new Promise(resolve => {
    const check = () => {
      if (done.completed >= (step.completed || 0) && done.failed >= (step.failed || 0)) resolve();
    };
    w.on('success', () => { done.completed += 1; check(); });
    w.on('failure', () => { done.failed += 1; check(); });
    w.start();
  });
  await w.end();
}

async function steps() {
  const queue = await queueObject();
  const held = [];
  let serial = 0; // node-resque refuses the same job twice at one timestamp: args tell them apart
  for (const step of spec.steps) {
    if (step.op === 'enqueue') {
      for (let i = 0; i < (step.count || 1); i += 1) {
        await queue.enqueue(step.queue, step.job || 'ok', step.args || [serial++]);
      }
    } else if (step.op === 'enqueueIn') {
      for (let i = 0; i < (step.count || 1); i += 1) {
        await queue.enqueueIn(step.ms, step.queue, step.job || 'ok', [serial++]);
      }
    } else if (step.op === 'work') {
      await workUntil(step);
    } else if (step.op === 'hold') {
      // a worker that takes one long job and keeps it running until this process ends
      const w = await worker(step);
      await new Promise(resolve => { w.once('job', resolve); w.start(); });
      held.push(w);
    } else if (step.op === 'idle') {
      const w = await worker(step);
      await new Promise(resolve => { w.once('pause', resolve); w.start(); });
      held.push(w);
    } else if (step.op === 'sleep') {
      await sleep(step.ms);
    } else {
      throw new Error(`unknown step ${step.op}`);
    }
  }
  await queue.end();
  console.log('ready');
  if (held.length === 0) return;
  // a held worker's job never ends (end() would wait for it): the process leaves its records
  await new Promise(resolve => process.once('SIGTERM', resolve));
}

// The library's own view: queues and their lengths, failed jobs, delayed jobs, workers, the
// jobs they run, the counters.
async function truth() {
  const queue = await queueObject();
  const version = require(path.resolve(installDir, 'node_modules', 'node-resque', 'package.json')).version;
  const result = { now_ms: Date.now(), version, queues: {} };
  for (const name of await queue.queues()) result.queues[name] = await queue.length(name);
  result.failed_count = await queue.failedCount();
  result.failed = (await queue.failed(0, -1)).map(job => job.queue);
  result.delayed = [];
  for (const tasks of Object.values(await queue.allDelayed())) {
    for (const task of tasks) result.delayed.push(task.queue);
  }
  result.workers = await queue.workers(); // name -> its queues, joined by commas
  result.working = {}; // name -> the job it runs ({queue, run_at_ms}), or null
  for (const [name, on] of Object.entries(await queue.allWorkingOn())) {
    result.working[name] = typeof on === 'string' ? null : { queue: on.queue, run_at_ms: Date.parse(on.run_at) };
  }
  result.stats = await queue.stats();
  await queue.end();
  console.log(JSON.stringify(result));
}

const commands = { steps, truth };
commands[command]().then(
  () => process.exit(0),
  error => { console.error(error); process.exit(1); },
);
