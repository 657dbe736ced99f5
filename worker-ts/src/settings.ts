// The worker's Kafka connection settings in the package's own terms (no Kafka client's types in the public
// options), and how `fromEnv` reads them from the service's variables (message_history/settings.py): the same
// names, values and defaults, so one environment configures the service and its workers.

/** TLS to the brokers; `ca` is PEM text (MESSAGE_HISTORY_KAFKA_SSL_CAFILE's content). */
export interface TlsOptions {
  ca?: string;
  cert?: string;
  key?: string;
  rejectUnauthorized?: boolean;
}

export interface SaslOptions {
  mechanism: 'plain' | 'scram-sha-256' | 'scram-sha-512';
  username: string;
  password: string;
}

export interface ConnectionOptions {
  /** Kafka bootstrap servers, e.g. ['127.0.0.1:9092']. */
  brokers: string[];
  /** TLS: true for the system's trusted CAs, or the CA (and a client certificate). Default: plaintext. */
  ssl?: boolean | TlsOptions;
  sasl?: SaslOptions;
}

export type Env = Readonly<Record<string, string | undefined>>;

const PROTOCOLS = ['PLAINTEXT', 'SSL', 'SASL_PLAINTEXT', 'SASL_SSL'] as const;
const MECHANISMS = { PLAIN: 'plain', 'SCRAM-SHA-256': 'scram-sha-256', 'SCRAM-SHA-512': 'scram-sha-512' } as const;

/**
 * The connection the service's variables describe: KAFKA_BOOTSTRAP_SERVERS, MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL
 * (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), MESSAGE_HISTORY_KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256,
 * SCRAM-SHA-512), MESSAGE_HISTORY_KAFKA_SASL_USERNAME, MESSAGE_HISTORY_KAFKA_SASL_PASSWORD,
 * MESSAGE_HISTORY_KAFKA_SSL_CAFILE (read with `readFile`). Throws on a value the service would refuse too.
 */
export function connectionFromEnv(env: Env, readFile: (path: string) => string): ConnectionOptions {
  const brokers = (env.KAFKA_BOOTSTRAP_SERVERS || '127.0.0.1:9092').split(',').map((b) => b.trim()).filter(Boolean);
  const protocol = (env.MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL || 'PLAINTEXT').toUpperCase();
  if (!(PROTOCOLS as readonly string[]).includes(protocol)) {
    throw new Error(`MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL=${protocol}: one of ${PROTOCOLS.join(', ')}`);
  }
  const connection: ConnectionOptions = { brokers };
  if (protocol === 'SSL' || protocol === 'SASL_SSL') {
    const cafile = env.MESSAGE_HISTORY_KAFKA_SSL_CAFILE;
    connection.ssl = cafile ? { ca: readFile(cafile) } : true;
  }
  if (protocol === 'SASL_PLAINTEXT' || protocol === 'SASL_SSL') {
    const name = (env.MESSAGE_HISTORY_KAFKA_SASL_MECHANISM || 'PLAIN').toUpperCase();
    const mechanism = MECHANISMS[name as keyof typeof MECHANISMS];
    if (mechanism === undefined) {
      throw new Error(`MESSAGE_HISTORY_KAFKA_SASL_MECHANISM=${name}: one of ${Object.keys(MECHANISMS).join(', ')}`);
    }
    const username = env.MESSAGE_HISTORY_KAFKA_SASL_USERNAME;
    const password = env.MESSAGE_HISTORY_KAFKA_SASL_PASSWORD;
    if (!username || password === undefined) {
      throw new Error(`${protocol} needs MESSAGE_HISTORY_KAFKA_SASL_USERNAME and MESSAGE_HISTORY_KAFKA_SASL_PASSWORD`);
    }
    connection.sasl = { mechanism, username, password };
  }
  return connection;
}
