// One agent turn against agentlearn from Node.js, with nothing but @grpc/grpc-js and
// @grpc/proto-loader over the repository's protos (no generated code):
//
//   cd examples/node && npm ci && node lifecycle.js --address 127.0.0.1:50051 --company acme --seat ana --role swe
//
// --address serves PrefetchService and BuiltinService; SubmitTurn goes to --reflector-address, the
// same unless given (split or on Kubernetes the reflector is a service at an address of its own).
//
// The turn: BuildTurnContext at turn start (its markdown goes at the end of the system prompt and
// the skills block's ids become offered_skills), ListTools for the model, each model tool call
// forwarded with CallTool, a refusal decoded from its google.rpc.Status, SubmitTurn at the end.
// The "model" is scripted. The last line printed is a JSON summary (the tests read it).
'use strict';

const path = require('path');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const ROOT = path.resolve(__dirname, '..', '..');
const PROTOS = path.join(ROOT, 'protos');
const GOOGLEAPIS = path.join(ROOT, 'clients', 'vendor', 'googleapis');

function flags(argv) {
  const out = {
    address: process.env.AGENTLEARN_ADDRESS || '127.0.0.1:50051',
    token: process.env.AGENTLEARN_TOKEN || '',
    company: 'acme',
    seat: 'ana',
    role: 'swe',
    'turn-id': `node-example-${Date.now()}`,
  };
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1];
  out['reflector-address'] = out['reflector-address'] || process.env.AGENTLEARN_REFLECTOR_ADDRESS || out.address;
  return out;
}

// The services, loaded from the .proto files at run time. keepCase keeps the proto field names
// (turn_id, not turnId); enums as strings and longs as strings keep JSON-friendly values.
function loadServices() {
  const definition = protoLoader.loadSync(
    ['agentlearn/prefetch/v1/prefetch_service.proto', 'agentlearn/reflector/v1/reflector_service.proto'],
    { includeDirs: [PROTOS], keepCase: true, enums: String, longs: String, defaults: true, oneofs: true },
  );
  return grpc.loadPackageDefinition(definition).agentlearn;
}

// google.rpc.Status and its details, to read a refusal's ErrorInfo (reason, domain, metadata) and
// BadRequest (every bad field) from the grpc-status-details-bin trailer.
function loadStatus() {
  const root = new protobuf.Root();
  root.resolvePath = (origin, target) => {
    const vendored = path.join(GOOGLEAPIS, target);
    return require('fs').existsSync(vendored) ? vendored : protobuf.util.path.resolve(origin, target);
  };
  root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
  return root;
}

function richError(err, statusRoot) {
  const out = { code: grpc.status[err.code], message: err.details, reason: '', domain: '', fields: [] };
  const [raw] = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (!raw) return out;
  const status = statusRoot.lookupType('google.rpc.Status').decode(raw);
  for (const detail of status.details) {
    const typeName = detail.type_url.split('/').pop();
    const decoded = statusRoot.lookupType(typeName).decode(detail.value);
    if (typeName === 'google.rpc.ErrorInfo') Object.assign(out, { reason: decoded.reason, domain: decoded.domain });
    if (typeName === 'google.rpc.BadRequest') out.fields = decoded.fieldViolations.map((v) => v.field);
  }
  return out;
}

// gRPC's own retries, UNAVAILABLE only, of the calls a second run of cannot double a write: the
// reads, and the writes with an idempotency key (CallTool's request_id, SubmitTurn's run id;
// BuildTurnContext and RefreshMemory by the run id). Not the typed writing builtins
// (ReflectAndPersist, RefineSkill, UseSkill, ...): their requests carry no key.
const PREFETCH = 'agentlearn.prefetch.v1.PrefetchService';
const BUILTINS = 'agentlearn.prefetch.v1.BuiltinService';
const REFLECTOR = 'agentlearn.reflector.v1.ReflectorService';
const SERVICE_CONFIG = {
  methodConfig: [
    {
      name: [
        ...['BuildTurnContext', 'ListTools', 'GetGuidance'].map((method) => ({ service: PREFETCH, method })),
        ...['CallTool', 'RefreshMemory', 'QueryEpisodes', 'SearchKnowledge'].map((method) => ({ service: BUILTINS, method })),
        ...['SubmitTurn', 'GetReflection', 'ListReflections'].map((method) => ({ service: REFLECTOR, method })),
      ],
      retryPolicy: {
        maxAttempts: 4,
        initialBackoff: '0.2s',
        maxBackoff: '3s',
        backoffMultiplier: 2,
        retryableStatusCodes: ['UNAVAILABLE'],
      },
    },
  ],
};

function call(client, method, request, token) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  const deadline = new Date(Date.now() + 60_000);
  return new Promise((resolve, reject) =>
    client[method](request, metadata, { deadline }, (err, response) => (err ? reject(err) : resolve(response))),
  );
}

function timestamp(date) {
  const ms = date.getTime();
  return { seconds: String(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 };
}

async function main() {
  const args = flags(process.argv.slice(2));
  const { company, seat, role, token } = args;
  const turnId = args['turn-id'];
  const api = loadServices();
  const statusRoot = loadStatus();
  const options = { 'grpc.service_config': JSON.stringify(SERVICE_CONFIG) };
  const credentials = grpc.credentials.createInsecure(); // createSsl(ca) for a TLS port
  const prefetch = new api.prefetch.v1.PrefetchService(args.address, credentials, options);
  const builtins = new api.prefetch.v1.BuiltinService(args.address, credentials, options);
  const reflector = new api.reflector.v1.ReflectorService(args['reflector-address'], credentials, options);

  const bob = { handle: 'bob', platform: 'slack', display_name: 'Bob' };
  const ask = 'Who approves prod deploys? I need one today.';
  const startTime = new Date();

  // 1. Turn start.
  const context = await call(
    prefetch,
    'BuildTurnContext',
    { company, seat, role, turn_id: turnId, ask, senders: [bob] },
    token,
  );
  const offered = context.blocks.filter((b) => b.block === 'BLOCK_SKILLS').flatMap((b) => b.ids);
  console.log(context.summary.line);
  console.log(context.markdown);

  // 2. The tools for the model (OpenAI-style function tools).
  const { tools } = await call(prefetch, 'ListTools', { company, role }, token);
  console.log('tools:', tools.map((t) => t.name).join(', '));

  // 3. The model's tool calls, forwarded by name (one dispatch for every builtin).
  const toolsCalled = [];
  let selfPersisted = false;
  async function callTool(name, args) {
    const answer = await call(
      builtins,
      'CallTool',
      {
        name,
        arguments_json: JSON.stringify(args),
        company,
        seat,
        role,
        turn_id: turnId,
        senders: [bob],
        request_id: crypto.randomUUID(), // one key per model tool call
      },
      token,
    );
    toolsCalled.push(name);
    selfPersisted = selfPersisted || name === 'reflect_and_persist';
    return { text: answer.text, result: JSON.parse(answer.result_json) };
  }
  const saved = await callTool('reflect_and_persist', { content: 'Dana approves prod deploys in #releases.' });
  console.log(saved.text);
  const recalled = await callTool('refresh_memory', { context_hint: 'who approves prod deploys' });
  console.log(recalled.text);
  let refusal = null;
  try {
    await callTool('reflect_and_persist', { tier: 'short' });
  } catch (err) {
    refusal = richError(err, statusRoot); // hand err.details back to the model as the tool result
    console.log('refused:', refusal.message);
  }

  // 4. Turn end: what the reflector learns from.
  const submitted = await call(
    reflector,
    'SubmitTurn',
    {
      turn: {
        turn_id: turnId,
        company,
        seat,
        role,
        label: 'Message from Bob: Slack message',
        what_it_did: 'Told Bob that Dana approves prod deploys in #releases.',
        outcome: 'TURN_OUTCOME_DONE',
        tool_sequence: toolsCalled,
        tools_called: toolsCalled,
        offered_skills: offered.map((id) => ({ id })),
        interactions: [{ sender: bob, body: ask, send_time: timestamp(startTime) }],
        self_persisted: selfPersisted,
        trigger_kind: 'TRIGGER_KIND_MESSAGE',
        start_time: timestamp(startTime),
        end_time: timestamp(new Date()),
      },
    },
    token,
  );
  for (const client of [prefetch, builtins, reflector]) client.close();
  console.log(
    JSON.stringify({
      turn_id: turnId,
      offered_skills: offered,
      note_id: saved.result.note_id,
      refresh_note_ids: recalled.result.note_ids,
      refusal: refusal && { code: refusal.code, reason: refusal.reason, fields: refusal.fields },
      queued: submitted.queued,
    }),
  );
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
